// Model-level memory techniques end to end on the tiny model (CPU): the planning estimate
// against the measured peak, what each technique saves, that checkpointing and offloading do
// not change the numbers, and the PEFT/QLoRA runs' files; plus `trainer_bin estimate`.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <vector>

#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "models/decoder.h"
#include "testing/testing.h"
#include "trainer_test_util.h"
#include "trainers/common/model_io.h"
#include "trainers/estimate/estimate.h"
#include "trainers/estimate/step_cost.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;
using testing::make_tiny_model;
using testing::run_command;
using testing::small_dataset;
using testing::trainer_bin;

const std::string& tiny_model() {
  static const std::string dir = make_tiny_model(testing::temp_dir("tiny_model"));
  return dir;
}

struct RunOutcome {
  TrainResult result;
  std::string out_dir;
  int64_t measured_peak = 0;
  int64_t estimated_peak = 0;
};

RunOutcome train_model(const std::string& model, const std::vector<std::string>& extra,
                       int64_t steps = 3) {
  RunOutcome r;
  r.out_dir = testing::temp_dir("out");
  std::vector<std::string> flags = {"--per_device_train_batch_size", "4", "--max_steps",
                                    std::to_string(steps)};
  flags.insert(flags.end(), extra.begin(), extra.end());
  const Options o = testing::tiny_sft_options(model, r.out_dir, flags);
  SftRun run = make_sft_run(o);
  r.result = run.trainer->train();
  r.measured_peak = r.result.memory.value("peak_allocated", int64_t{0});
  r.estimated_peak = r.result.memory["savings"]["estimate"].value("peak", int64_t{0});
  return r;
}

RunOutcome train(const std::vector<std::string>& extra, int64_t steps = 3) {
  return train_model(tiny_model(), extra, steps);
}

struct EstimateCase {
  std::string name;
  std::vector<std::string> flags;
};

class EstimateVsMeasured : public ::testing::TestWithParam<EstimateCase> {};

TEST_P(EstimateVsMeasured, WithinTenPercent) {
  const RunOutcome r = train(GetParam().flags);
  ASSERT_GT(r.measured_peak, 0);
  ASSERT_GT(r.estimated_peak, 0);
  const double rel = static_cast<double>(r.estimated_peak - r.measured_peak) /
                     static_cast<double>(r.measured_peak);
  EXPECT_LE(std::abs(rel), 0.10) << "estimated " << r.estimated_peak << " measured "
                                 << r.measured_peak;
}

INSTANTIATE_TEST_SUITE_P(
    TinyModelCpu, EstimateVsMeasured,
    ::testing::Values(
        EstimateCase{"full", {}},
        EstimateCase{"full_checkpointing", {"--gradient_checkpointing", "true"}},
        EstimateCase{"full_offloading", {"--activation_offloading", "true"}},
        EstimateCase{"full_checkpointing_offloading",
                     {"--gradient_checkpointing", "true", "--activation_offloading", "true"}},
        EstimateCase{"full_bf16", {"--bf16", "true"}},
        EstimateCase{"full_unfused_loss", {"--use_liger_kernel", "false"}},
        EstimateCase{"lora", {"--use_peft", "true"}},
        EstimateCase{"lora_checkpointing",
                     {"--use_peft", "true", "--gradient_checkpointing", "true"}},
        EstimateCase{"lora_all_linear",
                     {"--use_peft", "true", "--lora_target_modules", "all-linear"}},
        EstimateCase{"qlora", {"--use_peft", "true", "--load_in_4bit", "true"}},
        EstimateCase{
            "qlora_checkpointing",
            {"--use_peft", "true", "--load_in_4bit", "true", "--gradient_checkpointing", "true"}},
        EstimateCase{"qlora_checkpointing_offloading",
                     {"--use_peft", "true", "--load_in_4bit", "true", "--gradient_checkpointing",
                      "true", "--activation_offloading", "true"}},
        EstimateCase{"lora_int8", {"--use_peft", "true", "--load_in_8bit", "true"}}),
    [](const ::testing::TestParamInfo<EstimateCase>& i) { return i.param.name; });

// The tiny model's shapes in each family's layout (q/k norms, sandwich norms, fused projections,
// sliding windows): the estimate follows what each family's layer keeps.
struct FamilyCase {
  std::string name;
  nlohmann::json config;  // keys over tiny_config.json
  std::vector<std::string> flags;
};

class FamilyEstimateVsMeasured : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(FamilyEstimateVsMeasured, WithinTenPercent) {
  nlohmann::json cfg = read_json_file(testing::fixture_path("trainer/tiny_config.json"));
  cfg.update(GetParam().config);
  const std::string dir = testing::temp_dir("family_model");
  {
    // Freed before the run: the allocator's peak is the run's alone.
    DecoderModel m(ModelConfig::from_json(cfg, "family config"), Device::cpu(), DType::kF32);
    m.init_random(1);
    m.save(dir, DType::kF32);
  }
  copy_tokenizer_files(std::string(LT_SOURCE_DIR) + "/data/embedded", dir);
  const RunOutcome r = train_model(dir, GetParam().flags);
  ASSERT_GT(r.measured_peak, 0);
  const double rel = static_cast<double>(r.estimated_peak - r.measured_peak) /
                     static_cast<double>(r.measured_peak);
  EXPECT_LE(std::abs(rel), 0.10) << "estimated " << r.estimated_peak << " measured "
                                 << r.measured_peak;
  std::printf("%s: estimated %lld, measured %lld (%+.1f%%)\n", GetParam().name.c_str(),
              static_cast<long long>(r.estimated_peak), static_cast<long long>(r.measured_peak),
              100 * rel);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModelCpu, FamilyEstimateVsMeasured,
    ::testing::Values(
        FamilyCase{
            "qwen3",
            {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"head_dim", 16}},
            {}},
        FamilyCase{"mistral_lora",
                   {{"architectures", {"MistralForCausalLM"}},
                    {"model_type", "mistral"},
                    {"sliding_window", 16},
                    {"tie_word_embeddings", false}},
                   {"--use_peft", "true"}},
        FamilyCase{"phi3",
                   {{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}},
                   {"--gradient_checkpointing", "true"}},
        FamilyCase{"phi3_lora",
                   {{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}},
                   {"--use_peft", "true", "--lora_target_modules", "qkv_proj,gate_up_proj"}},
        FamilyCase{"phi3_qlora",
                   {{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}},
                   {"--use_peft", "true", "--load_in_4bit", "true", "--lora_target_modules",
                    "qkv_proj,gate_up_proj"}},
        FamilyCase{
            "gemma3_qlora_checkpointing",
            {{"architectures", {"Gemma3ForCausalLM"}},
             {"model_type", "gemma3_text"},
             {"head_dim", 8},
             {"sliding_window", 8}},
            {"--use_peft", "true", "--load_in_4bit", "true", "--gradient_checkpointing", "true"}},
        FamilyCase{"gemma3",
                   {{"architectures", {"Gemma3ForCausalLM"}},
                    {"model_type", "gemma3_text"},
                    {"head_dim", 8},
                    {"sliding_window", 8},
                    {"final_logit_softcapping", 30.0}},
                   {}}),
    [](const ::testing::TestParamInfo<FamilyCase>& i) { return i.param.name; });

TEST(MemoryTechniques, EachTechniqueLowersTheMeasuredPeak) {
  const int64_t full = train({}).measured_peak;
  const int64_t ckpt = train({"--gradient_checkpointing", "true"}).measured_peak;
  const int64_t offload = train({"--activation_offloading", "true"}).measured_peak;
  const int64_t lora = train({"--use_peft", "true"}).measured_peak;
  const int64_t qlora = train({"--use_peft", "true", "--load_in_4bit", "true"}).measured_peak;
  const int64_t qlora_ckpt =
      train({"--use_peft", "true", "--load_in_4bit", "true", "--gradient_checkpointing", "true"})
          .measured_peak;
  EXPECT_LT(ckpt, full);
  EXPECT_LT(offload, full);
  EXPECT_LT(lora, full);
  EXPECT_LT(qlora, lora);
  EXPECT_LT(qlora_ckpt, qlora);
}

TEST(MemoryTechniques, CheckpointingAndOffloadingLeaveTheLossesUnchanged) {
  const std::vector<double> plain = train({}, 4).result.losses;
  ASSERT_EQ(plain.size(), 4u);
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--gradient_checkpointing", "true"},
        std::vector<std::string>{"--activation_offloading", "true"},
        std::vector<std::string>{"--gradient_checkpointing", "true", "--activation_offloading",
                                 "true"}}) {
    const std::vector<double> l = train(flags, 4).result.losses;
    ASSERT_EQ(l.size(), plain.size());
    for (size_t i = 0; i < l.size(); ++i) EXPECT_EQ(l[i], plain[i]) << flags[0] << " step " << i;
  }
}

TEST(MemoryTechniques, QloraWritesAnAdapterAndLeavesTheBaseAlone) {
  const std::string base_before = testing::read_file(tiny_model() + "/model.safetensors");
  const RunOutcome r = train({"--use_peft", "true", "--load_in_4bit", "true",
                              "--lora_target_modules", "all-linear", "--learning_rate", "1e-2"},
                             6);
  EXPECT_EQ(testing::read_file(tiny_model() + "/model.safetensors"), base_before);
  ASSERT_TRUE(fs::exists(r.out_dir + "/adapter_config.json"));
  ASSERT_TRUE(fs::exists(r.out_dir + "/adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(r.out_dir + "/model.safetensors"));
  auto f = SafetensorsFile::open(r.out_dir + "/adapter_model.safetensors");
  // Two layers x seven projections x (A, B), PEFT's names.
  EXPECT_EQ(f->entries().size(), 28u);
  EXPECT_NE(nullptr, f->find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  const auto& l = r.result.losses;
  ASSERT_EQ(l.size(), 6u);
  EXPECT_LT(l.back(), l.front());
}

TEST(EstimateCommand, BareConfigAndBudgetSuggestions) {
  std::string out;
  const std::string cmd = trainer_bin() + " estimate --model_name_or_path " +
                          std::string(LT_SOURCE_DIR) +
                          "/bench/configs/qwen2.5-0.5b.json --max_length 2048"
                          " --per_device_train_batch_size 8 --device cpu --budget_gib 4";
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("494032768 parameters"), std::string::npos) << out;
  EXPECT_NE(out.find("budget 4.00 GiB: does not fit"), std::string::npos) << out;
  EXPECT_NE(out.find("--use_peft --load_in_4bit --gradient_checkpointing"), std::string::npos)
      << out;
}

// The suggestions' rows: the options and the step time ("time 1.33x").
std::vector<std::pair<std::string, double>> suggestions(const std::string& out) {
  std::vector<std::pair<std::string, double>> rows;
  const size_t at = out.find("options that fit, fastest first");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no suggestions in: " << out;
    return rows;
  }
  std::istringstream in(out.substr(at));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line) && line.rfind("  --", 0) == 0) {
    const size_t t = line.find(" time ");
    EXPECT_NE(t, std::string::npos) << line;
    rows.push_back({line.substr(2, line.find(" peak ") - 2), std::stod(line.substr(t + 6))});
  }
  return rows;
}

TEST(EstimateCommand, BudgetSuggestsOnlyPossibleBatchSplitsFastestFirst) {
  const std::string base = trainer_bin() + " estimate --model_name_or_path " +
                           std::string(LT_SOURCE_DIR) +
                           "/bench/configs/qwen2.5-0.5b.json --max_length 2048 --device cpu "
                           "--budget_gib 16 --per_device_train_batch_size ";
  std::string out;
  ASSERT_EQ(run_command(base + "4", &out), 0) << out;
  const auto rows = suggestions(out);
  ASSERT_FALSE(rows.empty()) << out;
  bool halved = false, quartered = false;
  for (size_t k = 0; k < rows.size(); ++k) {
    if (k > 0) {
      EXPECT_LE(rows[k - 1].second, rows[k].second) << out;
    }
    halved |= rows[k].first.find(
                  "--per_device_train_batch_size 2 "
                  "--gradient_accumulation_steps 2") == 0;
    quartered |= rows[k].first.find(
                     "--per_device_train_batch_size 1 "
                     "--gradient_accumulation_steps 4") == 0;
    // The same work in smaller micro-batches; recomputation adds a forward to 6N (8N / 6N).
    if (rows[k].first.rfind("--per_device_train_batch_size", 0) == 0) {
      EXPECT_DOUBLE_EQ(rows[k].second, 1.0) << rows[k].first;
      EXPECT_NE(out.find("time 1.00x + smaller GEMMs"), std::string::npos) << out;
    }
    if (rows[k].first == "--gradient_checkpointing") {
      EXPECT_NEAR(rows[k].second, 8.0 / 6.0, 0.006) << out;
    }
  }
  EXPECT_TRUE(halved && quartered) << out;
  EXPECT_EQ(out.find("smaller (per_device_train_batch_size"), std::string::npos) << out;
  EXPECT_EQ(out.find("--per_device_train_batch_size 0"), std::string::npos) << out;
  // A batch of 1 cannot be split; a batch of 6 only in halves.
  ASSERT_EQ(run_command(base + "1", &out), 0) << out;
  EXPECT_EQ(out.find("  --per_device_train_batch_size"), std::string::npos) << out;
  ASSERT_EQ(run_command(base + "6", &out), 0) << out;
  EXPECT_EQ(out.find("--per_device_train_batch_size 1 "), std::string::npos) << out;
}

TEST(Estimate, StepCostCountsRecomputationAndFrozenWeights) {
  EstimateConfig c;
  c.model = ModelConfig::load(std::string(LT_SOURCE_DIR) + "/bench/configs/qwen2.5-0.5b.json");
  c.micro_batch_tokens = 4096;
  c.max_seqlen = 4096;
  const MemoryEstimate full = estimate_memory(c);
  const StepCost now = step_cost(c, full, c);
  EXPECT_DOUBLE_EQ(now.flops, 6.0 * static_cast<double>(full.total_parameters) * 4096);
  EXPECT_TRUE(now.unmodelled.empty());
  EstimateConfig v = c;
  v.use_peft = v.gradient_checkpointing = v.activation_offloading = true;
  v.gradient_accumulation_steps = 2;
  const MemoryEstimate lora = estimate_memory(v);
  const StepCost s = step_cost(v, lora, c);
  const double n = static_cast<double>(lora.total_parameters);
  EXPECT_DOUBLE_EQ(s.flops,
                   (6.0 * n + 2.0 * static_cast<double>(lora.trainable_parameters)) * 4096 * 2);
  ASSERT_EQ(s.unmodelled.size(), 1u);
  EXPECT_EQ(s.unmodelled[0], "activation copies to the host");
}

TEST(Estimate, TechniquesShrinkTheirCategories) {
  EstimateConfig c;
  c.model = ModelConfig::load(std::string(LT_SOURCE_DIR) + "/bench/configs/llama3-8b.json");
  c.dtype = DType::kBF16;
  c.cpu = false;
  c.micro_batch_tokens = 8192;
  c.max_seqlen = 8192;
  const MemoryEstimate full = estimate_memory(c);
  // bf16 weights, grads; f32 moments and master weights: 2 + 2 + 12 bytes per parameter.
  EXPECT_EQ(full.params, full.total_parameters * 2);
  EXPECT_EQ(full.optimizer, full.trainable_parameters * 12);
  EstimateConfig ck = c;
  ck.gradient_checkpointing = true;
  const MemoryEstimate ckpt = estimate_memory(ck);
  // Only [tokens x hidden] tensors stay: the embedding's output, each layer's output, and the
  // final norm's output with its f32 rstd.
  const int64_t t = 8192, h = 4096;
  EXPECT_EQ(ckpt.activations, (1 + 32 + 1) * t * h * 2 + 4 * t);
  EstimateConfig q = ck;
  q.use_peft = q.load_in_4bit = true;
  q.lora_target_modules = {"all-linear"};
  const MemoryEstimate qlora = estimate_memory(q);
  // NF4 layers (0.52 B/param) beside the 16-bit embedding and head: about 5.8 GB of 16 GB.
  EXPECT_LT(qlora.params, full.params * 4 / 10);
  EXPECT_LT(qlora.trainable_parameters, full.trainable_parameters / 100);
  EXPECT_LT(qlora.peak, ckpt.peak / 3);
}

// ZeRO stage 3 in the estimate: on 8 ranks each rank keeps 1/8 of the sharded parameters, the
// small ones whole, and the outer unit (embedding, final norm, head) gathered for the step; a
// threshold above every parameter is stage 2's residency; one rank shards nothing.
TEST(Estimate, ZeroStage3ShardsTheParameters) {
  EstimateConfig c;
  c.model = ModelConfig::load(std::string(LT_SOURCE_DIR) + "/bench/configs/qwen2.5-7b.json");
  c.dtype = DType::kBF16;
  c.cpu = false;
  c.micro_batch_tokens = c.max_seqlen = 2048;
  c.gradient_checkpointing = true;
  c.world_size = 8;
  c.zero_stage = 2;
  const MemoryEstimate z2 = estimate_memory(c);
  c.zero_stage = 3;
  const MemoryEstimate z3 = estimate_memory(c);
  const ModelConfig& m = c.model;
  const int64_t h = m.hidden_size, l = m.num_hidden_layers;
  const int64_t outer = 2 * m.vocab_size * h + h;  // untied embedding and head, final norm
  // Sharded: every weight matrix and the embedding/head (all above 100,000 elements); the final
  // norm (h elements) stays whole.
  const int64_t biases = l * (h + 2 * m.num_key_value_heads * m.head_dim);
  const int64_t small = 2 * l * h + biases;  // the layers' norms and q/k/v biases
  const int64_t big = z2.total_parameters - small - h;
  EXPECT_EQ(z3.params, ((big * 2 + 7) / 8) + small * 2 + h * 2 + (outer - h) * 2);
  EXPECT_EQ(z3.grads, z2.grads);
  EXPECT_EQ(z3.optimizer, z2.optimizer);
  EXPECT_LT(z3.peak, z2.peak - z2.params / 2);
  c.stage3_param_persistence_threshold = int64_t{1} << 40;
  EXPECT_EQ(estimate_memory(c).params, z2.params);
  c.stage3_param_persistence_threshold = 100'000;
  c.world_size = 1;
  EXPECT_EQ(estimate_memory(c).params, z2.params);
}

// A quantized base under stage 3 is sharded at its stored size (NF4, about 0.52 B/param), not
// its dense one: what 8 ranks save over stage 2 is about a quarter of what a bf16 LoRA base saves.
TEST(Estimate, ZeroStage3ShardsAQuantizedBaseAtItsStoredSize) {
  EstimateConfig c;
  c.model = ModelConfig::load(std::string(LT_SOURCE_DIR) + "/bench/configs/qwen2.5-7b.json");
  c.dtype = DType::kBF16;
  c.cpu = false;
  c.micro_batch_tokens = c.max_seqlen = 2048;
  c.world_size = 8;
  c.use_peft = true;
  c.lora_target_modules = {"all-linear"};
  auto saved = [&c](bool quantized) {
    c.load_in_4bit = quantized;
    c.zero_stage = 2;
    const int64_t z2 = estimate_memory(c).params;
    c.zero_stage = 3;
    return z2 - estimate_memory(c).params;
  };
  const int64_t lora = saved(false), qlora = saved(true);
  EXPECT_GT(qlora, 0);
  EXPECT_LT(qlora, lora / 3);
  EXPECT_GT(qlora, lora / 6);
}

}  // namespace
}  // namespace leantune
