// The online trainers (trainer_bin grpo, rloo, online_dpo): per-token log-probabilities under a
// temperature against a float64 reference, the reward rising on the built-in task with built-in and
// with external-command rewards, TRL's reward statistics over the generation batch, the KL against
// the adapters-off reference, bad input (exit 2, one line naming the file, line or command), and
// sleep mode between phases with the estimate of each phase's peak.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cross_entropy.h"
#include "testing/testing.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/estimate/estimate_online.h"
#include "trainers/online/grpo.h"
#include "trainers/trainer_test_util.h"

namespace leantune {
namespace {

using testing::run_command;
using testing::trainer_bin;

std::vector<nlohmann::json> metrics_of(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

double value_or_nan(const nlohmann::json& j, const char* k) {
  return j.contains(k) && j[k].is_number() ? j[k].get<double>() : std::nan("");
}

// Mean of a metric over the first and over the last `n` logged records that carry it.
std::pair<double, double> first_last(const std::vector<nlohmann::json>& recs, const char* key,
                                     size_t n) {
  std::vector<double> v;
  for (const auto& r : recs)
    if (!std::isnan(value_or_nan(r, key))) v.push_back(r[key].get<double>());
  if (v.size() < 2 * n) return {std::nan(""), std::nan("")};
  double a = 0, b = 0;
  for (size_t i = 0; i < n; ++i) {
    a += v[i];
    b += v[v.size() - 1 - i];
  }
  return {a / static_cast<double>(n), b / static_cast<double>(n)};
}

// Per-token log-probabilities under a temperature: every counted row of a two-sequence batch
// against log_softmax(z / T) computed in float64 from the full logits, fused and plain, and the
// gradient of sum_t c_t logp_t against the per-sequence sums' gradient when c is constant per
// sequence.
TEST(Grpo, PerTokenLogprobsUnderTemperature) {
  const std::string dir = testing::temp_dir("grpo_logps");
  const std::string model_dir = testing::make_tiny_model(dir + "/model");
  auto model =
      std::shared_ptr<DecoderModel>(DecoderModel::load(model_dir, Device::cpu(), DType::kF32));
  model->set_requires_grad(true);
  const std::vector<int64_t> ids = {5, 9, 3, 17, 2, 8, 8, 1, 30, 4, 11};
  const std::vector<int64_t> labels = {-100, -100, 3, 17, 2, -100, 8, 1, 30, 4, -100};
  Batch b;
  b.input_ids = Tensor::from_vector(ids, {11});
  std::vector<int64_t> pos = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5};
  b.position_ids = Tensor::from_vector(pos, {11});
  b.labels = Tensor::from_vector(labels, {11});
  b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, 5, 11}, {3});
  b.max_seqlen = 6;
  const double temp = 0.7;
  auto zero_grads = [&] {
    for (auto& [name, p] : model->named_parameters()) p.zero_grad();
  };
  // The reference: full logits, shifted targets, log-softmax of z / T in double.
  std::vector<double> want(11, 0.0);
  {
    NoGradGuard ng;
    const Tensor hidden =
        model->hidden_states(b.input_ids, b.position_ids, b.cu_seqlens, b.max_seqlen, false);
    const Tensor z = model->logits(hidden);
    const std::vector<double> zv = z.to_f64();
    const std::vector<int64_t> tgt = kernels::shift_labels(b.labels, b.cu_seqlens).to_i64();
    const int64_t v = z.size(1);
    for (int64_t t = 0; t < 11; ++t) {
      if (tgt[t] == kernels::kIgnoreIndex) continue;
      double mx = -1e300;
      for (int64_t j = 0; j < v; ++j) mx = std::max(mx, zv[t * v + j] / temp);
      double s = 0;
      for (int64_t j = 0; j < v; ++j) s += std::exp(zv[t * v + j] / temp - mx);
      want[t] = zv[t * v + tgt[t]] / temp - mx - std::log(s);
    }
  }
  for (bool fused : {true, false}) {
    SequenceLogpsOptions lo;
    lo.fused = fused;
    lo.per_token = true;
    lo.temperature = temp;
    lo.chunk_tokens = 3;
    zero_grads();
    kernels::SequenceLogprobs r = sequence_logps(*model, b, lo);
    ASSERT_EQ(r.logps.numel(), 11);
    const std::vector<double> got = r.logps.to_f64();
    for (int64_t t = 0; t < 11; ++t) EXPECT_NEAR(got[t], want[t], 2e-5) << "row " << t;
    // d/dlogp = 1 on sequence 0's rows, 2 on sequence 1's.
    std::vector<double> g(11);
    for (int64_t t = 0; t < 11; ++t) g[t] = t < 5 ? 1.0 : 2.0;
    loss_from_sequence_gradient(r.logps, 0.0, g).backward();
    std::vector<double> per_token_grad;
    for (const auto& [name, p] : model->named_parameters())
      if (p.grad().defined())
        for (double x : p.grad().to_f64()) per_token_grad.push_back(x);
    zero_grads();
    lo.per_token = false;
    kernels::SequenceLogprobs s = sequence_logps(*model, b, lo);
    const std::vector<double> sums = s.logps.to_f64();
    EXPECT_NEAR(sums[0], want[1] + want[2] + want[3], 2e-5);
    EXPECT_NEAR(sums[1], want[5] + want[6] + want[7] + want[8], 2e-5);
    loss_from_sequence_gradient(s.logps, 0.0, {1.0, 2.0}).backward();
    size_t k = 0;
    double worst = 0;
    for (const auto& [name, p] : model->named_parameters())
      if (p.grad().defined())
        for (double x : p.grad().to_f64())
          worst = std::max(worst, std::abs(x - per_token_grad[k++]));
    EXPECT_EQ(k, per_token_grad.size());
    EXPECT_LT(worst, 1e-5) << (fused ? "fused" : "plain");
  }
}

// The built-in task with the built-in rewards: the mean reward of the last logged steps is
// clearly above that of the first ones (fixed seed).
TEST(Grpo, DemoRewardRises) {
  const std::string out = testing::temp_dir("grpo_demo");
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() + " grpo --device cpu 2>&1", &log), 0)
      << log;
  const auto recs = metrics_of(out + "/trainer_output/embedded_grpo/metrics.jsonl");
  const auto [first, last] = first_last(recs, "reward", 2);
  EXPECT_GT(last, first + 0.5) << log;
  EXPECT_FALSE(std::isnan(value_or_nan(recs.back(), "rewards/format_reward/mean"))) << log;
  EXPECT_FALSE(std::isnan(value_or_nan(recs.back(), "clip_ratio/region_mean"))) << log;
  EXPECT_NE(log.find("grpo: "), std::string::npos) << log;
  EXPECT_NE(log.find("peak allocated"), std::string::npos) << log;
  EXPECT_NE(log.find("optimizer phase peak"), std::string::npos) << log;
}

// One in-process grpo run on the built-in task: its losses, logged rewards and memory report.
struct OnlineOutcome {
  std::vector<double> losses, rewards;
  nlohmann::json generation;  // the memory report's generation entry
  OnlineEstimate estimate;    // trainer_bin estimate grpo with the same options
};
OnlineOutcome run_online(const std::string& out, std::vector<std::string> extra) {
  Options o = online_options("grpo");
  add_online_estimate_options(o);
  std::vector<std::string> args = {"--device",        "cpu", "--max_steps",  "8",
                                   "--logging_steps", "1",   "--output_dir", out};
  args.insert(args.end(), extra.begin(), extra.end());
  EXPECT_TRUE(o.parse(args));
  apply_demo_defaults(*find_trainer_spec("grpo"), o);
  OnlineOutcome res;
  res.estimate =
      estimate_online_from_options(o, "grpo", embedded_data_dir() + "/config.json", true);
  OnlineRun run = make_online_run("grpo", o);
  const TrainResult r = run.trainer->train();
  res.losses = r.losses;
  for (const auto& m : run.trainer->logged_metrics())
    if (m.contains("reward")) res.rewards.push_back(m["reward"].get<double>());
  res.generation = r.memory["savings"]["generation"];
  return res;
}

// Sleep mode (TRL's vllm_enable_sleep_mode, alias generation_sleep): the optimizer phase's peak
// falls by at least the KV-cache pool, measured by the allocator's phase windows, and the run is
// otherwise the same run: identical losses and rewards. A pool of 6 blocks of 4 tokens, where
// continuous batching runs two or three completions at a time, gives the same run again.
TEST(Grpo, SleepModeFreesThePoolForTheOptimizerPhase) {
  const std::string out = testing::temp_dir("grpo_sleep");
  const OnlineOutcome awake = run_online(out + "/awake", {});
  const OnlineOutcome asleep = run_online(out + "/asleep", {"--generation_sleep"});
  const OnlineOutcome small =
      run_online(out + "/small",
                 {"--vllm_enable_sleep_mode", "--kv_cache_blocks", "6", "--kv_block_size", "4"});
  ASSERT_EQ(awake.losses.size(), 8u);
  EXPECT_EQ(asleep.losses, awake.losses);
  EXPECT_EQ(asleep.rewards, awake.rewards);
  EXPECT_EQ(small.losses, awake.losses);
  EXPECT_EQ(small.rewards, awake.rewards);
  const int64_t pool = awake.generation["kv_cache_pool_bytes"].get<int64_t>();
  EXPECT_GT(pool, 0);
  EXPECT_FALSE(awake.generation["sleep_mode"].get<bool>());
  EXPECT_TRUE(asleep.generation["sleep_mode"].get<bool>());
  const int64_t opt_awake = awake.generation["optimizer_phase_peak_allocated"].get<int64_t>();
  const int64_t opt_asleep = asleep.generation["optimizer_phase_peak_allocated"].get<int64_t>();
  EXPECT_GE(opt_awake - opt_asleep, pool) << awake.generation.dump() << asleep.generation.dump();
  // What sleeping gave back includes the pool; the generation phase itself still holds it.
  EXPECT_GE(asleep.generation["sleep_released_bytes"].get<int64_t>(), pool);
  EXPECT_GE(asleep.generation["generation_phase_peak_allocated"].get<int64_t>(), pool);
  EXPECT_LT(asleep.generation["optimizer_phase_peak_reserved"].get<int64_t>(),
            awake.generation["optimizer_phase_peak_reserved"].get<int64_t>());
  // trainer_bin estimate grpo: the pool exactly, each phase's peak within 6% of the measured one.
  for (const OnlineOutcome* o : {&awake, &asleep}) {
    EXPECT_EQ(o->estimate.kv_pool, pool);
    const double gen = o->generation["generation_phase_peak_allocated"].get<double>();
    const double opt = o->generation["optimizer_phase_peak_allocated"].get<double>();
    EXPECT_NEAR(static_cast<double>(o->estimate.generation_peak) / gen, 1.0, 0.06);
    EXPECT_NEAR(static_cast<double>(o->estimate.optimizer_peak) / opt, 1.0, 0.06);
  }
  EXPECT_EQ(awake.estimate.optimizer_peak - asleep.estimate.optimizer_peak, pool);
  EXPECT_EQ(small.generation["kv_cache_blocks"].get<int64_t>(), 6);
  EXPECT_LE(small.generation["kv_blocks_peak_used"].get<int64_t>(), 6);
}

TEST(Rloo, DemoRewardRises) {
  const std::string out = testing::temp_dir("rloo_demo");
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() +
                            " rloo --device cpu --num_generations 4 --beta 0 2>&1",
                        &log),
            0)
      << log;
  const auto recs = metrics_of(out + "/trainer_output/embedded_rloo/metrics.jsonl");
  const auto [first, last] = first_last(recs, "reward", 2);
  EXPECT_GT(last, first + 0.5) << log;
}

// RLOO's default beta 0.05 takes a frozen copy of the policy as the reference: the KL in the
// first generation batch is exactly 0, later ones are not.
TEST(Rloo, KlPenaltyAgainstAFrozenCopy) {
  const std::string out = testing::temp_dir("rloo_kl");
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() +
                            " rloo --device cpu --max_steps 6 --logging_steps 1 2>&1",
                        &log),
            0)
      << log;
  const auto recs = metrics_of(out + "/trainer_output/embedded_rloo/metrics.jsonl");
  ASSERT_GE(recs.size(), 6u) << log;
  EXPECT_EQ(value_or_nan(recs[0], "kl"), 0.0) << log;
  EXPECT_GT(std::abs(value_or_nan(recs.back(), "kl")), 0.0) << log;
  EXPECT_NE(log.find("reference policy_copy"), std::string::npos) << log;
}

// online_dpo on the built-in task: the pairs' chosen completions (the better reward) are
// pushed up against the frozen copy, and the mean score rises.
TEST(OnlineDpo, DemoScoreRises) {
  const std::string out = testing::temp_dir("online_dpo_demo");
  std::string log;
  ASSERT_EQ(
      run_command("cd " + out + " && " + trainer_bin() + " online_dpo --device cpu 2>&1", &log), 0)
      << log;
  const auto recs = metrics_of(out + "/trainer_output/embedded_online_dpo/metrics.jsonl");
  const auto [first, last] = first_last(recs, "objective/scores", 2);
  EXPECT_GT(last, first + 0.5) << log;
  EXPECT_FALSE(std::isnan(value_or_nan(recs.back(), "rewards/margins"))) << log;
  EXPECT_FALSE(std::isnan(value_or_nan(recs.back(), "objective/kl"))) << log;
  EXPECT_EQ(value_or_nan(recs.back(), "beta"), 0.1) << log;
}

// online_dpo's max_length cuts the prompts' first tokens for scoring only: generation (and so
// the scores of the first batch) is unchanged, every sequence is counted as truncated, and the
// log-probabilities change with the lost context.
TEST(OnlineDpo, MaxLengthCutsThePromptsFront) {
  const std::string out = testing::temp_dir("online_dpo_max_length");
  std::string log;
  const std::string base = "cd " + out + " && " + trainer_bin() +
                           " online_dpo --device cpu --max_steps 1 --logging_steps 1";
  ASSERT_EQ(run_command(base + " --output_dir whole 2>&1", &log), 0) << log;
  ASSERT_EQ(run_command(base + " --max_length 5 --output_dir cut 2>&1", &log), 0) << log;
  const auto whole = metrics_of(out + "/whole/metrics.jsonl");
  const auto cut = metrics_of(out + "/cut/metrics.jsonl");
  ASSERT_EQ(whole.size(), 1u);
  ASSERT_EQ(cut.size(), 1u);
  EXPECT_EQ(value_or_nan(whole[0], "val/prompt_truncated_ratio"), 0.0);
  EXPECT_EQ(value_or_nan(cut[0], "val/prompt_truncated_ratio"), 1.0);
  EXPECT_EQ(value_or_nan(whole[0], "objective/scores"), value_or_nan(cut[0], "objective/scores"));
  EXPECT_NE(value_or_nan(whole[0], "logps/chosen"), value_or_nan(cut[0], "logps/chosen"));
}

// The same task scored only by an external process (a bash script in tests/fixtures/online).
TEST(Grpo, ExternalCommandRewardRises) {
  const std::string out = testing::temp_dir("grpo_command");
  const std::string script = testing::fixture_path("online/digit_reward.sh");
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() +
                            " grpo --device cpu --reward_funcs '' --reward_command 'bash " +
                            script + "' 2>&1",
                        &log),
            0)
      << log;
  const auto recs = metrics_of(out + "/trainer_output/embedded_grpo/metrics.jsonl");
  const auto [first, last] = first_last(recs, "rewards/reward_command/mean", 2);
  EXPECT_GT(last, first + 0.4) << log;
}

// TRL 1.16's reward statistics of a generation batch: reward and reward_std are the NaN-aware
// mean and (Bessel) std over the whole batch, frac_reward_zero_std the share of groups whose std
// is 0; rewards/<source>/mean|std per source; the terminated completions' min and max lengths.
// The rewards are recomputed from what the reward command gave (one generation batch per update).
TEST(Grpo, RewardStatisticsAreTrlsOverTheGenerationBatch) {
  const std::string out = testing::temp_dir("grpo_reward_stats");
  const std::string script = testing::fixture_path("online/logged_length_reward.sh");
  const std::string given = out + "/rewards.txt";
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() +
                            " grpo --device cpu --reward_funcs '' --reward_command 'bash " +
                            script + " " + given +
                            "' --max_steps 2 --logging_steps 1 --per_device_train_batch_size 8 "
                            "--num_generations 4 2>&1",
                        &log),
            0)
      << log;
  std::vector<double> rewards;
  {
    std::ifstream f(given);
    double r;
    while (f >> r) rewards.push_back(r);
  }
  ASSERT_EQ(rewards.size(), 16u) << log;
  const auto recs = metrics_of(out + "/trainer_output/embedded_grpo/metrics.jsonl");
  ASSERT_EQ(recs.size(), 2u) << log;
  for (size_t step = 0; step < 2; ++step) {
    const nlohmann::json& m = recs[step];
    const std::vector<double> batch(rewards.begin() + 8 * step, rewards.begin() + 8 * (step + 1));
    double mean = 0;
    for (double r : batch) mean += r / 8.0;
    double var = 0;
    for (double r : batch) var += (r - mean) * (r - mean) / 7.0;
    EXPECT_NEAR(value_or_nan(m, "reward"), mean, 1e-12) << step;
    EXPECT_NEAR(value_or_nan(m, "reward_std"), std::sqrt(var), 1e-12) << step;
    EXPECT_NEAR(value_or_nan(m, "rewards/reward_command/std"), std::sqrt(var), 1e-12) << step;
    int zero_groups = 0;
    for (size_t g = 0; g < 2; ++g) {
      const double* x = batch.data() + 4 * g;
      zero_groups += x[0] == x[1] && x[1] == x[2] && x[2] == x[3];
    }
    EXPECT_DOUBLE_EQ(value_or_nan(m, "frac_reward_zero_std"), zero_groups / 2.0) << step;
    const double lo = value_or_nan(m, "completions/min_terminated_length"),
                 mid = value_or_nan(m, "completions/mean_terminated_length"),
                 hi = value_or_nan(m, "completions/max_terminated_length");
    EXPECT_LE(lo, mid) << step;
    EXPECT_LE(mid, hi) << step;
    EXPECT_LE(hi, value_or_nan(m, "completions/max_length")) << step;
  }
}

// LoRA with beta: the reference is the policy with its adapters off, so the first update's KL is
// exactly 0 (B = 0 at initialisation) and later ones are not.
TEST(Grpo, KlAgainstAdaptersOffStartsAtZero) {
  const std::string out = testing::temp_dir("grpo_kl");
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() +
                            " grpo --device cpu --use_peft --beta 0.1 --max_steps 6 "
                            "--logging_steps 1 2>&1",
                        &log),
            0)
      << log;
  const auto recs = metrics_of(out + "/trainer_output/embedded_grpo/metrics.jsonl");
  ASSERT_GE(recs.size(), 6u) << log;
  EXPECT_EQ(value_or_nan(recs[0], "kl"), 0.0) << log;
  EXPECT_GT(value_or_nan(recs.back(), "kl"), 0.0) << log;
  EXPECT_NE(log.find("reference adapters_off"), std::string::npos) << log;
}

// num_iterations 2: old log-probabilities come from generation. The first pass over each
// generation batch scores with the weights that generated it (ratio exactly 1, nothing clipped);
// the second pass comes after an update, so with a tiny epsilon tokens with a nonzero advantage
// are clipped.
TEST(Grpo, NumIterationsKeepsOldLogprobs) {
  const std::string out = testing::temp_dir("grpo_iters");
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() +
                            " grpo --device cpu --num_iterations 2 --max_steps 16 "
                            "--logging_steps 1 --epsilon 0.0001 2>&1",
                        &log),
            0)
      << log;
  const auto recs = metrics_of(out + "/trainer_output/embedded_grpo/metrics.jsonl");
  ASSERT_EQ(recs.size(), 16u) << log;
  double second_pass = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    const double r = value_or_nan(recs[i], "clip_ratio/region_mean");
    if (i % 2 == 0)
      EXPECT_EQ(r, 0.0) << "update " << i + 1 << "\n" << log;
    else
      second_pass = std::max(second_pass, r);
  }
  EXPECT_GT(second_pass, 0.0) << log;
}

TEST(Grpo, BadInputIsOneLineExitTwo) {
  const std::string dir = testing::temp_dir("grpo_bad");
  const std::string model = testing::make_tiny_model(dir + "/model");
  {
    std::ofstream f(dir + "/noprompt.jsonl");
    f << "{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"text\": \"b\"}\n";
  }
  const std::string base = trainer_bin() + " grpo --device cpu --model_name_or_path " + model +
                           " --output_dir " + dir + "/out --max_steps 1 --max_completion_length 2";
  std::string log;
  EXPECT_EQ(
      run_command(
          base + " --dataset " + dir + "/noprompt.jsonl --reward_funcs accuracy_reward 2>&1", &log),
      2);
  EXPECT_NE(log.find("noprompt.jsonl:2: no \"prompt\" column"), std::string::npos) << log;
  {
    std::ofstream f(dir + "/nosolution.jsonl");
    f << "{\"prompt\": \"a\"}\n";
  }
  EXPECT_EQ(run_command(base + " --dataset " + dir +
                            "/nosolution.jsonl --reward_funcs accuracy_reward 2>&1",
                        &log),
            2);
  EXPECT_NE(log.find("nosolution.jsonl:1: accuracy_reward needs"), std::string::npos) << log;
  EXPECT_EQ(run_command(base + " --dataset " + dir + "/nosolution.jsonl 2>&1", &log), 2);
  EXPECT_NE(log.find("no reward source"), std::string::npos) << log;
  EXPECT_EQ(run_command(base + " --dataset " + dir + "/nosolution.jsonl --reward_command 'bash " +
                            testing::fixture_path("online/bad_reward.sh") + "' 2>&1",
                        &log),
            2);
  EXPECT_NE(log.find("bad_reward.sh"), std::string::npos) << log;
  EXPECT_NE(log.find("not-a-number"), std::string::npos) << log;
  EXPECT_EQ(run_command(base + " --dataset " + dir +
                            "/nosolution.jsonl --reward_funcs format_reward "
                            "--per_device_train_batch_size 3 2>&1",
                        &log),
            2);
  EXPECT_NE(log.find("must be a multiple of num_generations 8"), std::string::npos) << log;
  EXPECT_EQ(run_command(
                base + " --dataset " + dir + "/nosolution.jsonl --reward_funcs no_such_reward 2>&1",
                &log),
            2);
  EXPECT_NE(log.find("'no_such_reward' is neither"), std::string::npos) << log;
}

}  // namespace
}  // namespace leantune
