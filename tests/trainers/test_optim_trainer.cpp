// The optimizers in the training loop (--optim): loss curves of 200 steps on the tiny model
// against adamw_torch, bit-exact resume of each optimizer's state in a fresh process, the state
// bytes in the memory report, and the refusals (unknown name, resuming under another optim).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "loaders/model_config.h"
#include "models/decoder.h"
#include "testing/testing.h"
#include "trainer_test_util.h"
#include "trainers/common/model_io.h"
#include "trainers/common/optim_options.h"
#include "trainers/estimate/estimate.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;
using testing::make_tiny_model;
using testing::read_losses;
using testing::run_command;
using testing::small_dataset;
using testing::trainer_bin;

struct TrainRun {
  std::vector<double> losses;
  nlohmann::json memory;
};

TrainRun train(const std::string& model, const std::vector<std::string>& extra) {
  std::vector<std::string> e = {"--max_steps", "200",
                                "--packing",   "--per_device_train_batch_size",
                                "2",           "--learning_rate",
                                "3e-3",        "--weight_decay",
                                "0.01",        "--logging_steps",
                                "50"};
  e.insert(e.end(), extra.begin(), extra.end());
  SftRun run = make_sft_run(testing::tiny_sft_options(model, testing::temp_dir("out"), e));
  TrainResult r = run.trainer->train();
  return TrainRun{r.losses, r.memory};
}

double tail_mean(const std::vector<double>& l) {
  double s = 0;
  for (size_t i = l.size() - 20; i < l.size(); ++i) s += l[i];
  return s / 20;
}

TEST(OptimTrainer, EightBitAdamWTracksAdamWOver200Steps) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  const TrainRun ref = train(model, {"--optim", "adamw_torch"});
  const TrainRun q8 = train(model, {"--optim", "adamw_8bit"});
  ASSERT_EQ(ref.losses.size(), 200u);
  ASSERT_EQ(q8.losses.size(), 200u);
  // The run learns (the tail is well below the start) and ends within 2% of adamw_torch.
  EXPECT_LT(tail_mean(ref.losses), 0.8 * ref.losses[0]);
  EXPECT_NEAR(tail_mean(q8.losses), tail_mean(ref.losses), 0.02 * tail_mean(ref.losses));
  EXPECT_NE(ref.losses.back(), q8.losses.back());  // a different optimizer did run
  // The host-offloaded step (f32 model: the shadow is the weight itself) computes adamw_torch's
  // arithmetic: the same curve, bit for bit.
  const TrainRun off = train(model, {"--optim", "adamw_torch", "--offload_optimizer", "cpu"});
  EXPECT_EQ(off.losses, ref.losses);
  EXPECT_EQ(off.memory["optimizer"]["offload_optimizer"].get<std::string>(), "cpu");
  // Paged: on the host there is nothing to page, the 8-bit step is adamw_8bit's bit for bit;
  // the 32-bit one (bnb's f32 update, no master) ends within 2% of adamw_torch.
  const TrainRun paged8 = train(model, {"--optim", "paged_adamw_8bit"});
  EXPECT_EQ(paged8.losses, q8.losses);
  const TrainRun paged32 = train(model, {"--optim", "paged_adamw_32bit"});
  EXPECT_NEAR(tail_mean(paged32.losses), tail_mean(ref.losses), 0.02 * tail_mean(ref.losses));
  EXPECT_EQ(paged32.memory["optimizer"]["state_bytes"].get<int64_t>(),
            ref.memory["optimizer"]["state_bytes"].get<int64_t>());
  // State bytes: f32 model of P parameters: adamw_torch holds 8 P; adamw_8bit holds 2 bytes per
  // element of the embedding (the one tensor >= 4096 elements) plus absmax, 8 per other one.
  const int64_t ref_bytes = ref.memory["optimizer"]["state_bytes"];
  const int64_t q8_bytes = q8.memory["optimizer"]["state_bytes"];
  EXPECT_EQ(ref.memory["optimizer"]["optim"].get<std::string>(), "adamw_torch");
  const int64_t params = ref_bytes / 8, embed = 576 * 32;
  EXPECT_EQ(q8_bytes, 2 * embed + 8 * (embed / 256) + 8 * (params - embed));
  // The allocator saw them under the optimizer tag (blocks of 512 bytes round each tensor up).
  const int64_t ref_peak = ref.memory["peak_by_tag"]["optimizer"];
  const int64_t q8_peak = q8.memory["peak_by_tag"]["optimizer"];
  EXPECT_GE(ref_peak, ref_bytes);
  EXPECT_LT(ref_peak, ref_bytes + 40 * 1024);
  EXPECT_GE(q8_peak, q8_bytes);
  EXPECT_LT(q8_peak, q8_bytes + 40 * 1024);
}

TEST(OptimTrainer, Bf16WeightsWithoutMasterTrackAdamWOver200Steps) {
  // bf16 weights: adamw_torch keeps an f32 master; adamw_8bit and the paged variants keep none
  // and write each update back with stochastic rounding (rounded to nearest, as bitsandbytes
  // does, this run ends 32% above adamw_torch: updates below half an ulp are lost). The host-
  // offloaded 8-bit step updates an f32 shadow.
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  const TrainRun ref = train(model, {"--bf16", "--optim", "adamw_torch"});
  const double want = tail_mean(ref.losses);
  EXPECT_LT(want, 0.8 * ref.losses[0]);
  const TrainRun q8 = train(model, {"--bf16", "--optim", "adamw_8bit"});
  EXPECT_NEAR(tail_mean(q8.losses), want, 0.02 * want);
  const TrainRun paged8 = train(model, {"--bf16", "--optim", "paged_adamw_8bit"});
  EXPECT_EQ(paged8.losses, q8.losses);  // on the host nothing is paged
  const TrainRun paged32 = train(model, {"--bf16", "--optim", "paged_adamw_32bit"});
  EXPECT_NEAR(tail_mean(paged32.losses), want, 0.02 * want);
  const TrainRun off8 =
      train(model, {"--bf16", "--optim", "adamw_8bit", "--offload_optimizer", "cpu"});
  EXPECT_NEAR(tail_mean(off8.losses), want, 0.02 * want);
}

TEST(OptimTrainer, SgdLearnsAndAliasesMatch) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  const TrainRun sgd =
      train(model, {"--optim", "sgd", "--learning_rate", "0.3", "--max_steps", "60"});
  ASSERT_EQ(sgd.losses.size(), 60u);
  EXPECT_LT(tail_mean(sgd.losses), 0.9 * sgd.losses[0]);
  EXPECT_EQ(sgd.memory["optimizer"]["state_bytes"], 0);  // f32 weights: no master, no moments
  const TrainRun a = train(model, {"--optim", "adamw_8bit", "--max_steps", "5"});
  const TrainRun b = train(model, {"--optim", "adamw_bnb_8bit", "--max_steps", "5"});
  EXPECT_EQ(a.losses, b.losses);
}

class OptimResume : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimResume, IsBitExactInAFreshProcess) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  const std::string straight = testing::temp_dir("straight"),
                    resumed = testing::temp_dir("resumed");
  const std::string common = " --model_name_or_path " + model + " --dataset " + small_dataset() +
                             " --max_length 64 --packing --per_device_train_batch_size 2"
                             " --max_steps 16 --logging_steps 1 --learning_rate 2e-3"
                             " --weight_decay 0.1 --device cpu --seed 5 --optim " +
                             GetParam();
  std::string log;
  ASSERT_EQ(run_command(
                trainer_bin() + " sft" + common + " --save_steps 8 --output_dir " + straight, &log),
            0)
      << log;
  fs::copy(straight + "/checkpoint-8", resumed + "/checkpoint-8", fs::copy_options::recursive);
  ASSERT_EQ(run_command(trainer_bin() + " sft" + common + " --save_steps 0 --output_dir " +
                            resumed + " --resume_from_checkpoint latest",
                        &log),
            0)
      << log;
  auto a = read_losses(straight + "/metrics.jsonl"), b = read_losses(resumed + "/metrics.jsonl");
  ASSERT_EQ(a.size(), 16u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(b[i].second, a[8 + i].second) << "step " << b[i].first;
  EXPECT_EQ(testing::read_file(straight + "/model.safetensors"),
            testing::read_file(resumed + "/model.safetensors"));
  // Resuming under another optimizer is refused in one line, exit 2.
  const std::string other = GetParam() == "sgd" ? "adamw_torch" : "sgd --offload_optimizer none";
  const int rc = run_command(trainer_bin() + " sft" + common + " --optim " + other +
                                 " --output_dir " + testing::temp_dir("other") +
                                 " --resume_from_checkpoint " + straight + "/checkpoint-8",
                             &log);
  EXPECT_EQ(rc, 2) << log;
  const std::string optim = GetParam().substr(0, GetParam().find(" --bf16"));
  EXPECT_NE(log.find("holds the state of --optim " + optim), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Optims, OptimResume,
                         ::testing::Values("adamw_8bit", "adafactor", "sgd",
                                           "adamw_8bit --offload_optimizer cpu",
                                           // bf16 weights: stochastic rounding replays exactly
                                           "paged_adamw_8bit --bf16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

struct InBackwardCase {
  std::string name;
  std::vector<std::string> flags;
  bool checkpointing = false;
};

class OptimizerInBackward : public ::testing::TestWithParam<InBackwardCase> {};

TEST_P(OptimizerInBackward, IsBitIdenticalToTheStepAfterBackward) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  std::vector<std::string> flags = GetParam().flags;
  for (const char* f : {"--max_grad_norm", "0", "--max_steps", "30", "--logging_steps", "10"})
    flags.push_back(f);
  auto run = [&](bool in_backward, std::vector<std::vector<float>>* weights) {
    std::vector<std::string> e = flags;
    if (in_backward) e.push_back("--optimizer_in_backward");
    SftRun r = make_sft_run(testing::tiny_sft_options(model, testing::temp_dir("out"), e));
    TrainResult res = r.trainer->train();
    for (const auto& [n, t] : r.model->named_parameters()) weights->push_back(t.to_f32());
    return res;
  };
  std::vector<std::vector<float>> wa, wb;
  const TrainResult a = run(false, &wa), b = run(true, &wb);
  ASSERT_EQ(a.losses.size(), 30u);
  EXPECT_EQ(a.losses, b.losses);  // bit for bit
  EXPECT_EQ(wa, wb);
  EXPECT_LT(b.losses.back(), b.losses.front());
  // No full-model gradient buffer. The tiny model ties its embedding (576 x 32 f32, the largest
  // parameter) to the LM head: the head's part of its gradient, produced first in backward,
  // waits for the lookup's part, produced last; meanwhile one other gradient at a time is in
  // flight (the largest, an MLP weight of 64 x 32). Without optimizer_in_backward every
  // parameter's gradient is held at once.
  const std::vector<std::string>& f = GetParam().flags;
  const int64_t es = std::find(f.begin(), f.end(), "--bf16") != f.end() ? 2 : 4;
  const int64_t largest = 576 * 32 * es, second = 64 * 32 * es;
  const int64_t grads_b = b.memory["peak_by_tag"]["grad"];
  const int64_t grads_a = a.memory["peak_by_tag"]["grad"];
  EXPECT_GT(grads_a, largest + 6 * second);
  if (GetParam().checkpointing)
    EXPECT_LT(grads_b, grads_a);  // recomputed regions hold their own gradients in flight
  else
    EXPECT_LE(grads_b, largest + second);
}

INSTANTIATE_TEST_SUITE_P(
    Optims, OptimizerInBackward,
    ::testing::Values(
        InBackwardCase{"adamw_torch", {"--optim", "adamw_torch"}},
        InBackwardCase{"adamw_8bit_wd", {"--optim", "adamw_8bit", "--weight_decay", "0.1"}},
        InBackwardCase{"bf16_adamw_8bit_stochastic_rounding", {"--bf16", "--optim", "adamw_8bit"}},
        InBackwardCase{"sgd", {"--optim", "sgd", "--learning_rate", "0.1"}},
        InBackwardCase{"adafactor", {"--optim", "adafactor"}},
        InBackwardCase{"adamw_torch_checkpointing",
                       {"--optim", "adamw_torch", "--gradient_checkpointing"},
                       true}),
    [](const auto& info) { return info.param.name; });

// The tiny model with its own LM head.
std::string make_untied_tiny_model(const std::string& dir) {
  ModelConfig cfg = ModelConfig::load(testing::fixture_path("trainer/tiny_config.json"));
  cfg.tie_word_embeddings = false;
  DecoderModel m(cfg, Device::cpu(), DType::kF32);
  m.init_random(1);
  m.save(dir, DType::kF32);
  copy_tokenizer_files(std::string(LT_SOURCE_DIR) + "/data/embedded", dir);
  return dir;
}

TEST(OptimTrainer, OptimizerInBackwardHoldsAtMostTheLargestGradientUntied) {
  // An untied head and embedding (576 x 32 each, the largest parameters): the head's gradient
  // is handed out by blocks of rows inside the fused loss and the embedding's in backward (one
  // block here: 576 rows are fewer than a block); no two large gradients are ever held
  // together, so the gradient tag peaks at the largest parameter.
  const std::string dir = make_untied_tiny_model(testing::temp_dir("untied"));
  auto peak_grads = [&](bool in_bwd) {
    std::vector<std::string> e = {"--max_grad_norm", "0", "--max_steps", "3"};
    if (in_bwd) e.push_back("--optimizer_in_backward");
    SftRun r = make_sft_run(testing::tiny_sft_options(dir, testing::temp_dir("out"), e));
    return r.trainer->train().memory["peak_by_tag"]["grad"].get<int64_t>();
  };
  const int64_t largest = 576 * 32 * 4;
  EXPECT_LE(peak_grads(true), largest);
  EXPECT_GT(peak_grads(false), 2 * largest);
}

class UntiedByRows : public ::testing::TestWithParam<InBackwardCase> {};

TEST_P(UntiedByRows, TracksTheStepAfterBackward) {
  // Under optimizer_in_backward the untied head is updated by row blocks inside the loss (its
  // gradient from linear_cross_entropy_weight_blocks: the same sums formed another way, within
  // 3e-7 in f32) and the embedding by row blocks in backward (bit-identical rows): 30 steps stay
  // within f32 rounding of the step after backward (here they even come out bit for bit, the
  // gradient's differences lying below the weights' ulp after Adam's normalisation).
  // adafactor takes no rows: bit-identical by construction.
  const std::string dir = make_untied_tiny_model(testing::temp_dir("untied"));
  std::vector<std::string> flags = GetParam().flags;
  for (const char* f : {"--max_grad_norm", "0", "--max_steps", "30", "--logging_steps", "10"})
    flags.push_back(f);
  auto run = [&](bool in_backward, std::vector<std::vector<float>>* weights) {
    std::vector<std::string> e = flags;
    if (in_backward) e.push_back("--optimizer_in_backward");
    SftRun r = make_sft_run(testing::tiny_sft_options(dir, testing::temp_dir("out"), e));
    TrainResult res = r.trainer->train();
    for (const auto& [n, t] : r.model->named_parameters()) weights->push_back(t.to_f32());
    return res;
  };
  std::vector<std::vector<float>> wa, wb;
  const TrainResult a = run(false, &wa), b = run(true, &wb);
  ASSERT_EQ(a.losses.size(), 30u);
  ASSERT_EQ(b.losses.size(), 30u);
  const bool rows = GetParam().name != "adafactor";
  for (size_t i = 0; i < a.losses.size(); ++i) {
    if (rows) {
      EXPECT_NEAR(b.losses[i], a.losses[i], 1e-5 * std::abs(a.losses[i])) << "step " << i + 1;
    } else {
      EXPECT_EQ(b.losses[i], a.losses[i]) << "step " << i + 1;
    }
  }
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t p = 0; p < wa.size(); ++p)
    for (size_t k = 0; k < wa[p].size(); ++k)
      ASSERT_NEAR(wb[p][k], wa[p][k], rows ? 2e-5 : 0.0) << "parameter " << p << " element " << k;
  EXPECT_LT(b.losses.back(), b.losses.front());
}

INSTANTIATE_TEST_SUITE_P(
    Optims, UntiedByRows,
    ::testing::Values(InBackwardCase{"adamw_torch", {"--optim", "adamw_torch"}},
                      InBackwardCase{"adamw_torch_checkpointing_offloading",
                                     {"--optim", "adamw_torch", "--gradient_checkpointing",
                                      "--activation_offloading"}},
                      InBackwardCase{"sgd", {"--optim", "sgd", "--learning_rate", "0.1"}},
                      InBackwardCase{"adafactor", {"--optim", "adafactor"}}),
    [](const auto& info) { return info.param.name; });

TEST(OptimTrainer, OptimUpdatesRowsAgreesWithTheOptimizers) {
  Tensor p = testing::randn({4, 64}, DType::kF32, 1);
  for (const char* optim : {"adamw_torch", "adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit",
                            "paged_adamw_32bit", "adafactor", "sgd"})
    for (const char* off : {"none", "cpu"}) {
      if (std::string(off) == "cpu" && std::string(optim).rfind("paged_", 0) == 0) continue;
      auto opt = make_optimizer(OptimArguments{optim, true, off}, {{"w", p, true}}, AdamWConfig{});
      EXPECT_EQ(opt->supports_row_updates(), optim_updates_rows(optim)) << optim << " " << off;
    }
}

TEST(OptimTrainer, OptimizerInBackwardRefusesAccumulationAndClipping) {
  std::string log;
  const std::string base =
      trainer_bin() + " sft --model_name_or_path m --dataset d" + " --optimizer_in_backward";
  EXPECT_EQ(run_command(base, &log), 2);  // max_grad_norm defaults to 1.0
  EXPECT_NE(log.find("cannot combine with clipping by the global norm"), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_EQ(run_command(base + " --max_grad_norm 0 --gradient_accumulation_steps 4", &log), 2);
  EXPECT_NE(log.find("cannot combine with gradient_accumulation_steps 4"), std::string::npos)
      << log;
  EXPECT_EQ(run_command(trainer_bin() + " sft --model_name_or_path m --dataset d --optim "
                                        "paged_adamw_8bit --offload_optimizer cpu",
                        &log),
            2);
  EXPECT_NE(log.find("contradict"), std::string::npos) << log;
}

TEST(OptimTrainer, OffloadedBf16StepIsBitIdenticalToAdamW) {
  // bf16 weights: adamw_torch keeps an f32 master on the device; offloaded, the master is the
  // host shadow. Same arithmetic, so the same losses and weights to the last bit (on the CPU).
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  auto run = [&](const std::vector<std::string>& extra, std::vector<std::vector<float>>* w) {
    std::vector<std::string> e = {"--bf16", "--max_steps", "20", "--weight_decay", "0.1"};
    e.insert(e.end(), extra.begin(), extra.end());
    SftRun r = make_sft_run(testing::tiny_sft_options(model, testing::temp_dir("out"), e));
    TrainResult res = r.trainer->train();
    for (const auto& [n, t] : r.model->named_parameters()) w->push_back(t.to_f32());
    return res;
  };
  std::vector<std::vector<float>> wa, wb;
  const TrainResult a = run({}, &wa);
  const TrainResult b = run({"--offload_optimizer", "cpu"}, &wb);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(wa, wb);
  // Same bytes of master + moments (12 per parameter), held as host shadows here.
  EXPECT_EQ(a.memory["optimizer"]["state_bytes"], b.memory["optimizer"]["state_bytes"]);
}

TEST(OptimTrainer, EstimateShowsEachOptimizersBytesForLlama31_8B) {
  const ModelConfig m =
      ModelConfig::load(std::string(LT_SOURCE_DIR) + "/tests/fixtures/configs/llama3.1-8b.json");
  EstimateConfig c;
  c.model = m;
  c.dtype = DType::kBF16;
  c.cpu = false;
  c.micro_batch_tokens = 2 * 2048;
  c.max_seqlen = 2048;
  c.gradient_checkpointing = true;
  auto with = [&](const std::string& optim, bool in_bwd, bool offload) {
    EstimateConfig x = c;
    x.optim = optim;
    x.optimizer_in_backward = in_bwd;
    x.offload_optimizer = offload;
    return estimate_memory(x);
  };
  const MemoryEstimate torch = with("adamw_torch", false, false);
  const MemoryEstimate q8 = with("adamw_8bit", false, false);
  const MemoryEstimate q8_bwd = with("adamw_8bit", true, false);
  const MemoryEstimate off = with("adamw_8bit", true, true);
  const double n = static_cast<double>(torch.trainable_parameters);
  EXPECT_NEAR(n, 8.03e9, 0.01e9);
  EXPECT_DOUBLE_EQ(torch.optimizer / n, 12.0);  // two f32 moments + the f32 master of bf16
  EXPECT_NEAR(q8.optimizer / n, 2.0, 0.05);
  EXPECT_EQ(off.optimizer, 0);
  EXPECT_NEAR(off.optimizer_host / n, 6.0, 0.05);  // f32 master + 8-bit states, on the host
  const MemoryEstimate paged = with("paged_adamw_8bit", false, false);
  EXPECT_EQ(paged.optimizer, 0);
  EXPECT_NEAR(paged.optimizer_host / n, 2.0, 0.05);
  // optimizer_in_backward: the largest gradient in flight, the LM head's (bf16, the weight's
  // dtype, from the fused loss), instead of all of them.
  EXPECT_EQ(q8_bwd.grads, m.vocab_size * m.hidden_size * 2);
  // The walk's peak no longer holds every gradient at once: it falls in the loss or backward,
  // below the normal step's.
  EXPECT_LT(q8_bwd.peak, q8.peak);
  EXPECT_NE(q8_bwd.peak_phase, "optimizer step");
  EXPECT_LT(off.peak, q8_bwd.peak - q8_bwd.optimizer + 1);
}

TEST(OptimTrainer, UnknownOptimListsTheChoices) {
  std::string log;
  EXPECT_EQ(run_command(trainer_bin() + " sft --optim unknown", &log), 2);
  EXPECT_NE(log.find("adamw_torch, adamw_8bit, adamw_bnb_8bit, paged_adamw_8bit, "
                     "paged_adamw_32bit, adafactor, sgd"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace leantune
