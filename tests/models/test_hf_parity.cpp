// Parity with Hugging Face transformers on tiny random models of every family (fixtures made by
// tests/fixtures/gen_model_fixtures.py): logits, loss, every parameter gradient, greedy
// generation token for token, and the saved folder's tensor names against the ones transformers
// wrote (with LEANTUNE_MODEL_EXPORT_DIR set, each case's saved folder is also written there for
// `gen_model_fixtures.py --check DIR/CASE`, which loads it with transformers).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "engine/ops.h"
#include "loaders/safetensors.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "testing/testing.h"

namespace leantune {
namespace {

// The families added after Llama/Qwen2 are held to 1e-5 relative in f32 (logits and loss).
bool strict(const std::string& name) {
  return name.rfind("llama", 0) != 0 && name.rfind("qwen2", 0) != 0;
}

std::set<std::string> tensor_names(const std::string& dir) {
  std::set<std::string> out;
  for (const std::string& n : TensorStore::open(dir).names()) out.insert(n);
  return out;
}

class HfParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::fixture_path("models/" + GetParam());
    model_ = DecoderModel::load(dir_ + "/model", Device::cpu(), DType::kF32);
    ref_ = SafetensorsFile::open(dir_ + "/case.safetensors");
  }
  Batch batch() const {
    Batch b;
    b.input_ids = ref_->tensor("input_ids").clone(MemTag::kOther);
    b.labels = ref_->tensor("labels").clone(MemTag::kOther);
    b.cu_seqlens = ref_->tensor("cu_seqlens").clone(MemTag::kOther);
    std::vector<int64_t> cu = b.cu_seqlens.to_i64(), pos;
    for (size_t s = 1; s < cu.size(); ++s)
      for (int64_t i = cu[s - 1]; i < cu[s]; ++i) pos.push_back(i - cu[s - 1]);
    b.position_ids = Tensor::from_vector(pos, {static_cast<int64_t>(pos.size())});
    return b;
  }
  // |a - e| <= rel * (|e| + max|e| * 0.1): relative per element, with a floor tied to the
  // tensor's scale so that near-zero entries do not demand absurd precision.
  static ::testing::AssertionResult close_rel(const Tensor& a, const Tensor& e, double rel) {
    const double scale = ops::max_abs(e);
    return testing::all_close(a, e, rel * 0.1 * scale, rel);
  }
  std::string dir_;
  std::unique_ptr<DecoderModel> model_;
  std::shared_ptr<SafetensorsFile> ref_;
};

TEST_P(HfParity, LogitsAndLoss) {
  NoGradGuard ng;
  ForwardOptions opt;
  opt.need_logits = true;
  ForwardResult r = model_->forward(batch(), opt);
  const double tol = strict(GetParam()) ? 1e-5 : 1e-4;
  EXPECT_TRUE(close_rel(r.logits, ref_->tensor("logits"), tol));
  EXPECT_NEAR(r.loss.item(), ref_->tensor("loss").item(), tol * ref_->tensor("loss").item());
  EXPECT_EQ(r.label_tokens, 23);
  // The unfused path (full logits + cross_entropy) gives the same loss.
  opt.fused_loss = false;
  ForwardResult u = model_->forward(batch(), opt);
  EXPECT_NEAR(u.loss.item(), r.loss.item(), 1e-6 * r.loss.item());
}

TEST_P(HfParity, EveryParameterGradient) {
  model_->set_requires_grad(true);
  ForwardResult r = model_->forward(batch(), {});
  r.loss.backward();
  int checked = 0;
  for (const auto& [name, p] : model_->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(close_rel(p.grad(), ref_->tensor("grad." + name), 1e-3)) << name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(model_->named_parameters().size()));
}

TEST_P(HfParity, GradientCheckpointingGivesTheSameGradients) {
  model_->set_requires_grad(true);
  ForwardOptions opt;
  opt.gradient_checkpointing = true;
  model_->forward(batch(), opt).loss.backward();
  for (const auto& [name, p] : model_->named_parameters())
    EXPECT_TRUE(close_rel(p.grad(), ref_->tensor("grad." + name), 1e-3)) << name;
}

TEST_P(HfParity, GreedyGenerationMatchesTransformers) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int64_t>> expected;
  for (int i = 0; ref_->find("gen.prompt." + std::to_string(i)); ++i) {
    std::vector<int64_t> p = ref_->tensor("gen.prompt." + std::to_string(i)).to_i64();
    prompts.emplace_back(p.begin(), p.end());
    expected.push_back(ref_->tensor("gen.output." + std::to_string(i)).to_i64());
  }
  ASSERT_EQ(prompts.size(), 3u);
  GenerationConfig cfg;
  cfg.max_new_tokens = 12;
  GenerationResult r = generate(*model_, prompts, cfg);  // all prompts batched together
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> got(r.tokens[i].begin(), r.tokens[i].end());
    EXPECT_EQ(got, expected[i]) << "prompt " << i;
  }
  EXPECT_GT(r.kv_cache_bytes, 0);
}

TEST_P(HfParity, SaveAndReloadRoundTrips) {
  std::string out = testing::temp_dir("saved");
  model_->save(out, DType::kF32);
  auto again = DecoderModel::load(out, Device::cpu(), DType::kF32);
  auto a = model_->named_parameters(), b = again->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.to_f32(), b[i].second.to_f32()) << a[i].first;
  }
  EXPECT_TRUE(again->unused_tensors().empty());
  // The saved folder holds exactly the tensors transformers wrote for this model: nothing it
  // would miss or not expect when loading ours.
  EXPECT_EQ(tensor_names(out), tensor_names(dir_ + "/model"));
  EXPECT_EQ(ModelConfig::load(out).num_parameters(), model_->num_parameters());
  if (const char* env = std::getenv("LEANTUNE_MODEL_EXPORT_DIR")) {
    const std::string dst = std::string(env) + "/" + GetParam();
    std::filesystem::create_directories(env);
    model_->save(dst, DType::kF32);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HfParity,
                         ::testing::Values("llama_gqa", "qwen2_bias", "qwen2_tied", "llama3_rope",
                                           "qwen3", "qwen3_swa", "mistral", "phi3", "gemma3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace leantune
