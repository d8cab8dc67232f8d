// Long context (CPU): sequence tiling measured and estimated at 16,384 tokens, and
// `estimate --max_context`.
//   - A small Llama whose MLP is wide beside its hidden size (64 -> 1,024, as 4,096 -> 14,336 is
//     in Llama-3-8B in proportion, exaggerated), trained by `trainer_bin sft` on packed
//     16,384-token micro-batches with gradient checkpointing, untiled and tiled: the allocator's
//     peak falls with tiling, and the estimate is within 5% of both peaks, in the same phase.
//   - Sequence-tiled layers of the families that add to the tiled regions (Qwen3's q/k norms,
//     Phi-3's fused qkv_proj and gate_up_proj, Gemma 3's q/k norms, sandwich norms and GeGLU):
//     small models (64 -> 2,048) over 8,192 tokens in blocks of 2,048, with and without
//     checkpointing: the estimate within 5% of the measured peak, in the same phase.
//   - estimate --max_context for bench/configs/llama3-8b.json (QLoRA, checkpointing, offloading):
//     the issue's figures (>= 400,000 tokens in 80 GiB, >= 1,000,000 in 141 GiB), the longest
//     length found is the longest that fits (one token more does not), and bad budgets are one
//     line with exit 2.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "loaders/model_config.h"
#include "testing/testing.h"
#include "trainer_test_util.h"
#include "trainers/estimate/max_context.h"

namespace leantune {
namespace {

using testing::run_command;
using testing::trainer_bin;

// A model of the config's JSON members `family` (architecture, sizes) over the shared ones, made
// by init-model once per name.
std::string init_model(const std::string& name, const std::string& family) {
  const std::string root = testing::temp_dir("long_context_model_" + name);
  const std::string cfg = root + "/config.json", out = root + "/model";
  std::ofstream(cfg) << "{" << family << R"(, "num_hidden_layers": 2, "head_dim": 32,
      "max_position_embeddings": 65536, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
      "initializer_range": 0.02, "tie_word_embeddings": true, "vocab_size": 576,
      "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "float32"})";
  const std::string data = std::string(LT_SOURCE_DIR) + "/data/embedded";
  std::string log;
  LT_CHECK(run_command(trainer_bin() + " init-model --model_config " + cfg + " --out " + out +
                           " --tokenizer " + data,
                       &log) == 0,
           "init-model failed: ", log);
  std::ofstream(out + "/tokenizer_config.json")
      << testing::read_file(data + "/tokenizer_config.json");
  return out;
}

std::string long_context_model() {
  static const std::string dir = init_model("llama", R"("architectures": ["LlamaForCausalLM"],
      "model_type": "llama", "hidden_size": 64, "intermediate_size": 1024,
      "num_attention_heads": 2, "num_key_value_heads": 1)");
  return dir;
}

struct Measured {
  double peak_mib = 0, estimate_percent = 1e9;
  std::string phase, estimated_phase;
};

Measured run_sft(const std::string& flags, const std::string& name,
                 const std::string& model = long_context_model(), int64_t max_length = 16384) {
  const std::string cmd = trainer_bin() + " sft --model_name_or_path " + model + " --dataset " +
                          std::string(LT_SOURCE_DIR) +
                          "/data/embedded/stories.jsonl --packing true --max_length " +
                          std::to_string(max_length) +
                          " --per_device_train_batch_size 1 --max_steps 2 --save_steps 0"
                          " --device cpu --output_dir " +
                          testing::temp_dir("long_context_" + name) + " " + flags;
  std::string out;
  EXPECT_EQ(run_command(cmd, &out), 0) << out;
  Measured m;
  std::smatch r;
  if (std::regex_search(out, r, std::regex(R"(peak allocated ([0-9.]+) MiB during ([a-z ]+),)"))) {
    m.peak_mib = std::stod(r[1]);
    m.phase = r[2];
  }
  if (std::regex_search(
          out, r,
          std::regex(
              R"(estimated peak [0-9.]+ [KMG]iB during ([a-z ]+) \([^\n]*: ([+-][0-9.]+)% of measured)"))) {
    m.estimated_phase = r[1];
    m.estimate_percent = std::stod(r[2]);
  }
  EXPECT_GT(m.peak_mib, 0) << out;
  EXPECT_LE(std::abs(m.estimate_percent), 5.0) << out;
  EXPECT_EQ(m.phase, m.estimated_phase) << out;
  EXPECT_NE(out.find(flags.find("--tiled_mlp true") != std::string::npos
                         ? "sequence tiling: decoder layers in blocks of"
                         : "saved by the enabled techniques"),
            std::string::npos)
      << out;
  return m;
}

class LongContext : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(LongContext, TilingLowersThePeakAndTheEstimateFollows) {
  const auto& [name, flags] = GetParam();
  const Measured plain = run_sft(flags + " --tiled_mlp false", name + "_untiled");
  const Measured tiled = run_sft(flags + " --tiled_mlp true", name + "_tiled");
  // Untiled, the layer's [16384 x 1024] gate, up and activation and their gradients (64 MiB
  // each in f32) dominate; tiled, blocks of 1,024 rows of them.
  EXPECT_LT(tiled.peak_mib, plain.peak_mib * 0.5) << tiled.peak_mib << " vs " << plain.peak_mib;
}

INSTANTIATE_TEST_SUITE_P(
    Llama2x64Mlp1024Len16384, LongContext,
    ::testing::Values(std::pair<std::string, std::string>{"full_checkpointing",
                                                          "--gradient_checkpointing true"},
                      std::pair<std::string, std::string>{
                          "lora_checkpointing_offloading",
                          "--use_peft true --lora_target_modules all-linear "
                          "--gradient_checkpointing true --activation_offloading true"}),
    [](const auto& i) { return i.param.first; });

struct TiledFamily {
  std::string name, config;  // the family's config members
  bool checkpointing;
};

class TiledFamilies : public ::testing::TestWithParam<TiledFamily> {};

TEST_P(TiledFamilies, TheEstimateFollowsThePeak) {
  const TiledFamily& f = GetParam();
  const std::string name = f.name + (f.checkpointing ? "_checkpointing" : "_plain");
  const std::string model =
      init_model(name, f.config + R"(, "hidden_size": 64, "intermediate_size": 2048,
      "num_attention_heads": 8, "num_key_value_heads": 4)");
  // run_sft checks the estimate (within 5%, same phase) and that the layers were tiled.
  run_sft(std::string("--tiled_mlp true --tiled_mlp_chunk_size 2048 --gradient_checkpointing ") +
              (f.checkpointing ? "true" : "false"),
          name, model, 8192);
}

const std::string kQwen3 = R"("architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3")";
const std::string kPhi3 = R"("architectures": ["Phi3ForCausalLM"], "model_type": "phi3")";
const std::string kGemma3 =
    R"("architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "sliding_window": 512)";

INSTANTIATE_TEST_SUITE_P(
    Len8192Chunk2048, TiledFamilies,
    ::testing::Values(TiledFamily{"qwen3", kQwen3, true}, TiledFamily{"qwen3", kQwen3, false},
                      TiledFamily{"phi3", kPhi3, true}, TiledFamily{"phi3", kPhi3, false},
                      TiledFamily{"gemma3", kGemma3, true}, TiledFamily{"gemma3", kGemma3, false}),
    [](const auto& i) {
      return i.param.name + (i.param.checkpointing ? "_checkpointing" : "_plain");
    });

const std::string kQlora =
    " --model_name_or_path " + std::string(LT_SOURCE_DIR) +
    "/bench/configs/llama3-8b.json --use_peft --load_in_4bit --gradient_checkpointing "
    "--activation_offloading";

int64_t max_length_of(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(\n  max_length ([0-9]+) tokens)"))) return -1;
  return std::stoll(m[1]);
}

TEST(EstimateMaxContext, Llama3_8bQloraReachesTheIssuesLengths) {
  // On the CPU (f32), on CUDA in bf16 (the compute dtype of a QLoRA run on a GPU), and on CUDA in
  // f32 (the issue's command as a GPU machine runs it: the simple attention kernel writes dQ in
  // place, no f32 accumulator).
  for (const std::string device : {"--device cpu", "--device cuda --bf16", "--device cuda"}) {
    for (const auto& [gib, at_least] : {std::pair<int, int64_t>{80, 400'000}, {141, 1'000'000}}) {
      std::string out;
      ASSERT_EQ(run_command(trainer_bin() + " estimate --max_context --budget_gib " +
                                std::to_string(gib) + kQlora + " " + device,
                            &out),
                0)
          << out;
      EXPECT_GE(max_length_of(out), at_least) << device << ", " << gib << " GiB:\n" << out;
      EXPECT_NE(out.find("tiled in blocks of 4096"), std::string::npos) << out;
    }
  }
  // Without QLoRA, offloading and tiling the same budget holds far less; the options that raise
  // it are listed with their lengths.
  std::string out;
  ASSERT_EQ(run_command(trainer_bin() +
                            " estimate --max_context --budget_gib 80 --device cuda "
                            "--bf16 --tiled_mlp false --model_name_or_path " +
                            std::string(LT_SOURCE_DIR) + "/bench/configs/llama3-8b.json",
                        &out),
            0)
      << out;
  EXPECT_EQ(max_length_of(out), 0) << out;  // the full model's AdamW state alone passes 80 GiB
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"(--use_peft --load_in_4bit +max_length [1-9][0-9]+ tokens)")))
      << out;
}

// The length found is the longest that fits: one token more passes the budget (two budgets).
TEST(EstimateMaxContext, TheLengthFoundIsTheLongestThatFits) {
  EstimateConfig c;
  c.model = ModelConfig::load(std::string(LT_SOURCE_DIR) + "/bench/configs/llama3-8b.json");
  c.cpu = false;
  c.dtype = DType::kBF16;
  c.use_peft = c.load_in_4bit = c.gradient_checkpointing = c.activation_offloading = true;
  for (double gib : {8.0, 80.0}) {
    const int64_t limit = static_cast<int64_t>(gib * (1 << 30));
    const ContextFit f = max_context(c, 1, limit);
    ASSERT_GT(f.max_length, 0) << gib;
    EXPECT_LE(estimate_memory(with_sequence_length(c, 1, f.max_length)).peak, limit) << gib;
    EXPECT_GT(estimate_memory(with_sequence_length(c, 1, f.max_length + 1)).peak, limit) << gib;
  }
}

TEST(EstimateMaxContext, BadBudgetsAreOneLineExitTwo) {
  for (const std::string bad : {"", " --budget_gib 0", " --budget_gib -3", " --budget_gib abc"}) {
    std::string out;
    EXPECT_EQ(run_command(trainer_bin() + " estimate --max_context" + bad, &out), 2) << bad;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << bad << ": " << out;
    EXPECT_NE(out.find("budget_gib"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace leantune
