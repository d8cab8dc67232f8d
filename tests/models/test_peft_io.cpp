// PEFT adapter files (models/peft_io.h, trainers/common/peft_options.h) against PEFT itself, with
// the fixtures of tests/fixtures/gen_peft_fixtures.py:
//   - an adapter PEFT wrote loads here and gives PEFT's logits, loss and adapter gradients;
//   - what our writer produces for it has PEFT's key names, shapes, dtypes, bytes and
//     adapter_config.json fields, and loads back to the same logits;
//   - merging matches PEFT's merge_and_unload, and the merged HF folder gives the same logits;
//   - an adapter made from scratch here round-trips (and, with LEANTUNE_PEFT_EXPORT_DIR set, is
//     left there for `gen_peft_fixtures.py --check DIR`, which loads it into PEFT, as is our
//     rewrite of each fixture's adapter under DIR/CASE);
//   - the trainer's options, base-path resolution and the errors for unsupported configs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>

#include "engine/ops.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "models/peft_io.h"
#include "testing/testing.h"
#include "trainers/common/peft_options.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

std::string case_dir(const std::string& name) { return testing::fixture_path("peft/" + name); }

Batch reference_batch(const SafetensorsFile& ref) {
  Batch b;
  b.input_ids = ref.tensor("input_ids").clone(MemTag::kOther);
  b.labels = ref.tensor("labels").clone(MemTag::kOther);
  b.cu_seqlens = ref.tensor("cu_seqlens").clone(MemTag::kOther);
  std::vector<int64_t> cu = b.cu_seqlens.to_i64(), pos;
  for (size_t s = 1; s < cu.size(); ++s)
    for (int64_t i = cu[s - 1]; i < cu[s]; ++i) pos.push_back(i - cu[s - 1]);
  b.position_ids = Tensor::from_vector(pos, {static_cast<int64_t>(pos.size())});
  return b;
}

// |a - e| <= rel * (|e| + 0.1 max|e|), as the HF parity tests compare.
::testing::AssertionResult close_rel(const Tensor& a, const Tensor& e, double rel) {
  return testing::all_close(a, e, rel * 0.1 * ops::max_abs(e), rel);
}

Tensor logits_of(DecoderModel& model, const Batch& batch) {
  NoGradGuard ng;
  ForwardOptions opt;
  opt.need_logits = true;
  opt.need_loss = false;
  return model.forward(batch, opt).logits;
}

// The module names a target_modules list selects under PEFT's rule (exact or "." suffix).
std::set<std::string> selected(DecoderModel& model, const nlohmann::json& targets) {
  std::set<std::string> out;
  for (LinearModule* m : model.linear_modules())
    for (const auto& t : targets) {
      const std::string s = t.get<std::string>();
      if (m->name == s ||
          (m->name.size() > s.size() &&
           m->name.compare(m->name.size() - s.size() - 1, s.size() + 1, "." + s) == 0))
        out.insert(m->name);
    }
  return out;
}

class PeftFiles : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = case_dir(GetParam());
    ref_ = SafetensorsFile::open(dir_ + "/reference.safetensors");
    std::string base;
    read_adapter_config(adapter(), &base);
    base_ = (fs::path(dir_) / base).lexically_normal().string();
  }
  std::string adapter() const { return dir_ + "/peft_adapter"; }
  std::unique_ptr<DecoderModel> base_model() const {
    return DecoderModel::load(base_, Device::cpu(), DType::kF32);
  }
  std::string dir_, base_;
  std::shared_ptr<SafetensorsFile> ref_;
};

TEST_P(PeftFiles, PeftAdapterGivesPeftLogits) {
  auto model = base_model();
  PeftSetup s = load_adapter(adapter(), *model);
  s.set_training(false);
  EXPECT_TRUE(close_rel(logits_of(*model, reference_batch(*ref_)), ref_->tensor("logits"), 1e-4));
}

TEST_P(PeftFiles, LossAndAdapterGradientsMatchPeft) {
  auto model = base_model();
  PeftSetup s = load_adapter(adapter(), *model);
  s.set_training(false);  // PEFT's reference ran in eval mode (no dropout)
  ForwardResult r = model->forward(reference_batch(*ref_));
  const double loss = ref_->tensor("loss").item();
  EXPECT_NEAR(r.loss.item(), loss, 1e-5 * loss);
  r.loss.backward();
  int checked = 0;
  for (const auto& [key, t] : s.trainable_parameters(*model)) {
    ASSERT_TRUE(t.grad().defined()) << key;
    EXPECT_TRUE(close_rel(t.grad(), ref_->tensor("grad." + key), 1e-3)) << key;
    ++checked;
  }
  EXPECT_EQ(checked,
            static_cast<int>(
                SafetensorsFile::open(adapter() + "/adapter_model.safetensors")->entries().size()));
  for (const auto& [name, t] : model->named_parameters()) {
    const bool saved =
        std::find(s.saved_modules.begin(), s.saved_modules.end(), name) != s.saved_modules.end();
    EXPECT_EQ(t.grad().defined(), saved) << name;
  }
}

TEST_P(PeftFiles, OurWriterReproducesPeftFiles) {
  auto model = base_model();
  PeftSetup s = load_adapter(adapter(), *model);
  const nlohmann::json peft_cfg = read_json_file(adapter() + "/adapter_config.json");
  const std::string out = testing::temp_dir("adapter");
  save_adapter(s, *model, out, peft_cfg["base_model_name_or_path"].get<std::string>());

  // Tensors: the same names, dtypes, shapes and bytes.
  auto theirs = SafetensorsFile::open(adapter() + "/adapter_model.safetensors");
  auto ours = SafetensorsFile::open(out + "/adapter_model.safetensors");
  ASSERT_EQ(ours->entries().size(), theirs->entries().size());
  for (const SafetensorsEntry& e : theirs->entries()) {
    const SafetensorsEntry* o = ours->find(e.name);
    ASSERT_NE(o, nullptr) << e.name;
    EXPECT_EQ(o->dtype, e.dtype) << e.name;
    EXPECT_EQ(o->shape, e.shape) << e.name;
    EXPECT_EQ(ours->tensor(*o).to_f64(), theirs->tensor(e).to_f64()) << e.name;
  }
  EXPECT_EQ(ours->metadata(), theirs->metadata());

  // Config: every field equal, byte for byte once serialised, except target_modules, which
  // PEFT 0.21 writes as full module names for all-linear (in set order) and we write as the
  // sorted layer kinds: both must select the same modules.
  nlohmann::json mine = read_json_file(out + "/adapter_config.json");
  EXPECT_EQ(selected(*model, mine["target_modules"]), selected(*model, peft_cfg["target_modules"]));
  nlohmann::json a = mine, b = peft_cfg;
  a.erase("target_modules");
  b.erase("target_modules");
  EXPECT_EQ(a.dump(2), b.dump(2));

  // Our files load back to the same logits.
  auto again = base_model();
  PeftSetup s2 = load_adapter(out, *again);
  s.set_training(false);
  s2.set_training(false);
  const Batch batch = reference_batch(*ref_);
  const Tensor logits = logits_of(*model, batch);
  EXPECT_EQ(logits_of(*again, batch).to_f64(), logits.to_f64());
  // Our adapter for PEFT to load (gen_peft_fixtures.py --check DIR/CASE), with our logits.
  if (const char* env = std::getenv("LEANTUNE_PEFT_EXPORT_DIR"); env && *env) {
    const std::string dst = std::string(env) + "/" + GetParam();
    save_adapter(s, *model, dst, fs::absolute(base_).string());
    save_safetensors(
        dst + "/leantune_logits.safetensors",
        {{"input_ids", batch.input_ids}, {"cu_seqlens", batch.cu_seqlens}, {"logits", logits}});
  }
}

TEST_P(PeftFiles, MergedModelMatchesPeftMergeAndUnload) {
  auto model = base_model();
  PeftSetup s = load_adapter(adapter(), *model);
  int checked = 0;
  for (const auto& [name, t] : merged_parameters(s, *model, DType::kF32)) {
    const std::string key = "merged." + name;
    if (!ref_->find(key)) continue;
    EXPECT_TRUE(testing::all_close(t, ref_->tensor(key), 1e-6, 1e-5)) << name;
    ++checked;
  }
  EXPECT_GE(checked, 2);
  const std::string out = testing::temp_dir("merged");
  merge_and_save(s, *model, out, DType::kF32);
  auto merged = DecoderModel::load(out, Device::cpu(), DType::kF32);
  EXPECT_TRUE(merged->unused_tensors().empty());
  EXPECT_TRUE(close_rel(logits_of(*merged, reference_batch(*ref_)), ref_->tensor("logits"), 1e-4));
}

TEST_P(PeftFiles, LoadModelOrAdapterResolvesTheBase) {
  PeftSetup s;
  auto model = load_model_or_adapter(adapter(), Device::cpu(), DType::kF32, &s);
  ASSERT_TRUE(s.active());
  EXPECT_FALSE(s.runtime->training);
  EXPECT_EQ(fs::path(resolve_base_model_path(adapter())), fs::path(base_));
  EXPECT_TRUE(close_rel(logits_of(*model, reference_batch(*ref_)), ref_->tensor("logits"), 1e-4));
  PeftSetup plain;
  auto base = load_model_or_adapter(base_, Device::cpu(), DType::kF32, &plain);
  EXPECT_FALSE(plain.active());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PeftFiles,
                         ::testing::Values("llama_gqa", "qwen2_tied", "qwen3", "mistral", "phi3",
                                           "gemma3"));

// An adapter made here: rsLoRA on every linear layer, the head trained whole, trainable tokens,
// random B. It must round-trip; with LEANTUNE_PEFT_EXPORT_DIR set it is also written there with
// our logits for gen_peft_fixtures.py --check.
TEST(PeftExport, AdapterMadeHereRoundTrips) {
  const std::string base = testing::fixture_path("models/llama_gqa/model");
  auto model = DecoderModel::load(base, Device::cpu(), DType::kF32);
  PeftConfig cfg;
  cfg.r = 4;
  cfg.lora_alpha = 12;
  cfg.use_rslora = true;
  cfg.lora_dropout = 0.1;
  cfg.target_modules = {"all-linear"};
  cfg.modules_to_save = {"lm_head"};
  cfg.trainable_token_indices = {9, 10, 250};
  PeftSetup s = apply_peft(cfg, *model, 2024);
  {
    NoGradGuard ng;
    Generator g(5);
    for (const auto& a : s.adapters) normal_(a->lora_B(), g, 0.0, 0.05);
    Tensor noise = Tensor::empty(s.tokens->delta().shape(), DType::kF32);
    normal_(noise, g, 0.0, 0.05);
    ops::add_(s.tokens->delta(), noise);
  }
  s.set_training(false);
  auto ref = SafetensorsFile::open(case_dir("llama_gqa") + "/reference.safetensors");
  Batch batch = reference_batch(*ref);
  {
    // Make the listed tokens appear.
    std::vector<int64_t> ids = batch.input_ids.to_i64();
    ids[1] = 9;
    ids[4] = 250;
    ids[11] = 10;
    batch.input_ids = Tensor::from_vector(ids, {static_cast<int64_t>(ids.size())});
  }
  const Tensor logits = logits_of(*model, batch);
  const char* env = std::getenv("LEANTUNE_PEFT_EXPORT_DIR");
  const std::string out = env && *env ? std::string(env) : testing::temp_dir("export");
  save_peft(s, *model, out, fs::absolute(base).string());
  save_safetensors(
      out + "/leantune_logits.safetensors",
      {{"input_ids", batch.input_ids}, {"cu_seqlens", batch.cu_seqlens}, {"logits", logits}});
  const nlohmann::json cfg_json = read_json_file(out + "/adapter_config.json");
  EXPECT_EQ(cfg_json["r"], 4);
  EXPECT_EQ(cfg_json["lora_alpha"], 12);
  EXPECT_EQ(cfg_json["use_rslora"], true);
  EXPECT_EQ(cfg_json["modules_to_save"], nlohmann::json::array({"lm_head"}));
  EXPECT_EQ(cfg_json["trainable_token_indices"], nlohmann::json::array({9, 10, 250}));
  EXPECT_EQ(cfg_json["peft_type"], "LORA");
  EXPECT_EQ(cfg_json["task_type"], "CAUSAL_LM");

  PeftSetup back;
  auto again = load_model_or_adapter(out, Device::cpu(), DType::kF32, &back);
  EXPECT_EQ(logits_of(*again, batch).to_f64(), logits.to_f64());
  EXPECT_EQ(back.adapters.size(), 14u);
  EXPECT_DOUBLE_EQ(back.adapters[0]->scaling(), 6.0);
  EXPECT_DOUBLE_EQ(back.adapters[0]->dropout(), 0.1);
}

// ---------------------------------------------------------------- configs and errors

// Writes a copy of a fixture adapter with its config changed by `edit`.
std::string edited_adapter(const std::string& name,
                           const std::function<void(nlohmann::json&)>& edit) {
  const std::string src = case_dir("qwen2_tied") + "/peft_adapter";
  const std::string dst = testing::temp_dir(name);
  fs::copy_file(src + "/adapter_model.safetensors", dst + "/adapter_model.safetensors");
  nlohmann::json j = read_json_file(src + "/adapter_config.json");
  j["base_model_name_or_path"] = testing::fixture_path("models/qwen2_tied/model");
  edit(j);
  write_text_atomic(dst + "/adapter_config.json", j.dump(2));
  return dst;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(PeftErrors, UnsupportedFeaturesAreNamed) {
  auto model = DecoderModel::load(testing::fixture_path("models/qwen2_tied/model"), Device::cpu(),
                                  DType::kF32);
  const std::string dora = edited_adapter("dora", [](nlohmann::json& j) { j["use_dora"] = true; });
  EXPECT_NE(error_of([&] { load_adapter(dora, *model); }).find("DoRA"), std::string::npos);
  const std::string bias = edited_adapter("bias", [](nlohmann::json& j) { j["bias"] = "all"; });
  EXPECT_NE(error_of([&] { load_adapter(bias, *model); }).find("bias"), std::string::npos);
  const std::string ia3 = edited_adapter("ia3", [](nlohmann::json& j) { j["peft_type"] = "IA3"; });
  EXPECT_NE(error_of([&] { load_adapter(ia3, *model); }).find("IA3"), std::string::npos);
}

TEST(PeftErrors, TensorsMustMatchTheConfig) {
  auto model = DecoderModel::load(testing::fixture_path("models/qwen2_tied/model"), Device::cpu(),
                                  DType::kF32);
  // Without modules_to_save, the norm weights in the file belong to nothing.
  const std::string extra =
      edited_adapter("extra", [](nlohmann::json& j) { j["modules_to_save"] = nullptr; });
  EXPECT_NE(error_of([&] { load_adapter(extra, *model); }).find("norm.weight' does not belong"),
            std::string::npos);
  const std::string more = edited_adapter("more", [](nlohmann::json& j) {
    j["target_modules"] = {"q_proj", "k_proj", "v_proj"};
  });
  EXPECT_NE(error_of([&] { load_adapter(more, *model); }).find("k_proj.lora_A.weight' is missing"),
            std::string::npos);
  const std::string rank = edited_adapter("rank", [](nlohmann::json& j) { j["r"] = 4; });
  EXPECT_NE(error_of([&] { load_adapter(rank, *model); }).find("has shape [8, 64]"),
            std::string::npos);
}

TEST(PeftErrors, MissingBaseModelNamesThePaths) {
  const std::string dir = edited_adapter(
      "nobase", [](nlohmann::json& j) { j["base_model_name_or_path"] = "no/such/model"; });
  const std::string msg =
      error_of([&] { load_model_or_adapter(dir, Device::cpu(), DType::kF32, nullptr); });
  EXPECT_NE(msg.find("'no/such/model' not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("adapter_config.json"), std::string::npos) << msg;
}

TEST(PeftConfigFile, RankAndAlphaPatternsApplyPerModule) {
  auto model = DecoderModel::load(testing::fixture_path("models/llama_gqa/model"), Device::cpu(),
                                  DType::kF32);
  PeftConfig cfg;
  cfg.r = 4;
  cfg.lora_alpha = 8;
  cfg.target_modules = {"q_proj", "v_proj"};
  cfg.rank_pattern = {{"layers.1.self_attn.v_proj", 2}};
  cfg.alpha_pattern = {{"v_proj", 1}};
  PeftSetup s = apply_peft(cfg, *model, 1);
  ASSERT_EQ(s.adapters.size(), 4u);
  EXPECT_EQ(s.adapters[0]->r(), 4);
  EXPECT_DOUBLE_EQ(s.adapters[0]->scaling(), 2.0);   // q_proj: 8 / 4
  EXPECT_DOUBLE_EQ(s.adapters[1]->scaling(), 0.25);  // layer 0 v_proj: 1 / 4
  EXPECT_EQ(s.adapters[3]->r(), 2);                  // layer 1 v_proj
  EXPECT_DOUBLE_EQ(s.adapters[3]->scaling(), 0.5);
  const std::string out = testing::temp_dir("patterns");
  save_adapter(s, *model, out, "base");
  const PeftConfig back = read_adapter_config(out);
  EXPECT_EQ(back.rank_pattern, cfg.rank_pattern);
  EXPECT_EQ(back.alpha_pattern, cfg.alpha_pattern);
  auto again = DecoderModel::load(testing::fixture_path("models/llama_gqa/model"), Device::cpu(),
                                  DType::kF32);
  EXPECT_EQ(load_adapter(out, *again).adapters[3]->r(), 2);
}

// ---------------------------------------------------------------- trainer options

Options parsed(const std::vector<std::string>& args) {
  Options o("test");
  add_peft_options(o);
  o.parse(args);
  return o;
}

TEST(PeftOptions, TrlDefaults) {
  const PeftConfig c = peft_table().read(parsed({})).config;
  EXPECT_EQ(c.r, 16);
  EXPECT_DOUBLE_EQ(c.lora_alpha, 32);
  EXPECT_DOUBLE_EQ(c.lora_dropout, 0.05);
  EXPECT_TRUE(c.target_modules.empty());
  EXPECT_FALSE(c.use_rslora);
  EXPECT_TRUE(c.modules_to_save.empty());
  EXPECT_TRUE(c.trainable_token_indices.empty());
  EXPECT_FALSE(parsed({}).get_bool("merge_adapter"));
  auto model = DecoderModel::load(testing::fixture_path("models/llama_gqa/model"), Device::cpu(),
                                  DType::kF32);
  EXPECT_FALSE(apply_peft_options(parsed({}), *model, 1).active());
  PeftSetup s = apply_peft_options(parsed({"--use_peft"}), *model, 1);
  ASSERT_TRUE(s.active());
  EXPECT_EQ(s.config_target_modules(), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_DOUBLE_EQ(s.adapters[0]->scaling(), 2.0);
  EXPECT_DOUBLE_EQ(s.adapters[0]->dropout(), 0.05);
  EXPECT_TRUE(s.runtime->training);
}

TEST(PeftOptions, FlagsReachTheSetup) {
  auto model = DecoderModel::load(testing::fixture_path("models/qwen2_tied/model"), Device::cpu(),
                                  DType::kF32);
  PeftSetup s = apply_peft_options(
      parsed({"--use_peft", "--lora_r", "8", "--lora_alpha", "16", "--use_rslora",
              "--lora_target_modules", "all-linear", "--lora_modules_to_save", "model.norm",
              "--trainable_token_indices", "3,17", "--lora_dropout", "0"}),
      *model, 1);
  EXPECT_EQ(s.adapters.size(), 14u);
  EXPECT_DOUBLE_EQ(s.adapters[0]->scaling(), 16 / std::sqrt(8.0));
  EXPECT_EQ(s.saved_modules, (std::vector<std::string>{"model.norm.weight"}));
  ASSERT_NE(s.tokens, nullptr);
  EXPECT_EQ(s.tokens->indices(), (std::vector<int64_t>{3, 17}));
  // Per layer: q, k, v, o, gate, up, down with r = 8 (A: 8 x in, B: out x 8), H = 64,
  // q out 64, k/v out 32, intermediate 96; plus 2 token rows and model.norm.
  const int64_t per_layer = 8 * ((64 + 64) + (64 + 32) * 2 + (64 + 64) + (64 + 96) * 2 + (96 + 64));
  EXPECT_EQ(s.num_trainable_parameters(*model), 2 * per_layer + 2 * 64 + 64);
}

TEST(PeftOptions, ErrorsNameTheOption) {
  auto model = DecoderModel::load(testing::fixture_path("models/qwen2_tied/model"), Device::cpu(),
                                  DType::kF32);
  EXPECT_NE(error_of([&] {
              apply_peft_options(parsed({"--lora_r", "8"}), *model, 1);
            }).find("option lora_r needs use_peft"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] {
        apply_peft_options(parsed({"--use_peft", "--trainable_token_indices", "3,x"}), *model, 1);
      }).find("trainable_token_indices: 'x'"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        apply_peft_options(parsed({"--use_peft", "--lora_modules_to_save", "lm_head"}), *model, 1);
      }).find("tied"),
      std::string::npos);
}

}  // namespace
}  // namespace leantune
