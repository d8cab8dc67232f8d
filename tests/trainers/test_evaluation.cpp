// Evaluation during training (trainers/common/evaluation.h) and the checkpoint's trainer_state.json
// in transformers' schema: the options' rules, the best-model bookkeeping, rotation that keeps
// the best checkpoint, each trainer's evaluation metrics against an independent computation
// (sft: full logits in double; dpo, kto, reward: the training step's own metrics on the same
// rows with learning rate 0), load_best_model_at_end and log_history across a resume.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/autograd.h"
#include "loaders/host_batch.h"
#include "testing/testing.h"
#include "trainer_test_util.h"
#include "trainers/common/checkpoint.h"
#include "trainers/common/evaluation.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;
using testing::make_tiny_model;
using testing::run_command;
using testing::trainer_bin;

TrainingArguments parse(const std::vector<std::string>& args) {
  Options o = sft_options();
  o.parse(args);
  return training_arguments(o);
}

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    return e.what();
  }
  return "";
}

TEST(EvalOptions, StrategyStepsAndTheirDefaults) {
  TrainingArguments a = parse({});
  EXPECT_EQ(a.eval_strategy, "no");
  a = parse({"--eval_steps", "5"});  // leantune's older form: steps implied
  EXPECT_EQ(a.eval_strategy, "steps");
  EXPECT_EQ(a.eval_steps, 5);
  a = parse({"--eval_strategy", "steps", "--logging_steps", "3"});  // transformers: None -> logging
  EXPECT_EQ(a.eval_steps, 3);
  a = parse({"--eval_strategy", "epoch"});
  EXPECT_TRUE(eval_due(a, 0, 4, 2));
  EXPECT_FALSE(eval_due(a, 0, 3, 2));
  a = parse({"--eval_strategy", "steps", "--eval_steps", "4"});
  EXPECT_TRUE(eval_due(a, resolve_steps(a.eval_steps, 100), 8, 100));
  EXPECT_FALSE(eval_due(a, resolve_steps(a.eval_steps, 100), 6, 100));
  // transformers' ratios: below 1, a share of all updates rounded up.
  EXPECT_EQ(resolve_steps(0.25, 10), 3);
  EXPECT_EQ(resolve_steps(0.1, 100), 10);
  EXPECT_EQ(resolve_steps(7, 100), 7);
  EXPECT_EQ(resolve_steps(0, 100), 0);
  EXPECT_NE(error_of({"--logging_steps", "2.5"})
                .find("option --logging_steps 2.5: a number of "
                      "updates (an integer from 1) or a ratio"),
            std::string::npos);
  EXPECT_NE(error_of({"--save_steps", "-1"}).find("save_steps"), std::string::npos);
  EXPECT_NE(error_of({"--logging_steps", "0"}).find("must be above 0"), std::string::npos);
  EXPECT_NE(error_of({"--load_best_model_at_end", "--eval_steps", "0.1", "--save_steps", "10"})
                .find("both updates or both ratios"),
            std::string::npos);
  EXPECT_TRUE(parse({"--load_best_model_at_end", "--eval_steps", "0.1", "--save_steps", "0.2"})
                  .load_best_model_at_end);
  EXPECT_NE(error_of({"--eval_strategy", "no", "--eval_steps", "5"})
                .find("option --eval_steps 5 is for eval_strategy steps, not no"),
            std::string::npos);
  EXPECT_NE(error_of({"--eval_strategy", "epoch", "--eval_steps", "5"}).find("not epoch"),
            std::string::npos);
}

TEST(EvalOptions, LoadBestModelAtEndFollowsTransformersRules) {
  EXPECT_NE(error_of({"--load_best_model_at_end"}).find("needs --eval_strategy steps or epoch"),
            std::string::npos);
  EXPECT_NE(error_of({"--load_best_model_at_end", "--eval_strategy", "epoch"})
                .find("save_strategy (steps) must equal eval_strategy (epoch)"),
            std::string::npos);
  EXPECT_NE(error_of({"--load_best_model_at_end", "--eval_steps", "2", "--save_steps", "3"})
                .find("save_steps (3) must be a multiple of eval_steps (2)"),
            std::string::npos);
  const TrainingArguments a =
      parse({"--load_best_model_at_end", "--eval_steps", "2", "--save_steps", "4"});
  EXPECT_TRUE(a.load_best_model_at_end);
  EXPECT_EQ(best_metric_key(a), "eval_loss");
  EXPECT_FALSE(greater_is_better(a));
}

TEST(EvalOptions, GreaterIsBetterFollowsTheMetricName) {
  EvalArguments a;
  a.metric_for_best_model = "rewards/accuracies";
  EXPECT_TRUE(greater_is_better(a));
  EXPECT_EQ(best_metric_key(a), "eval_rewards/accuracies");
  a.metric_for_best_model = "eval_loss";
  EXPECT_FALSE(greater_is_better(a));
  EXPECT_EQ(best_metric_key(a), "eval_loss");
  a.greater_is_better = true;
  EXPECT_TRUE(greater_is_better(a));
}

TEST(BestModel, TracksTheBestAndNamesAMissingMetric) {
  EvalArguments a;
  BestModel best;
  EXPECT_TRUE(update_best(best, a, {{"eval_loss", 2.0}}, 2));
  EXPECT_FALSE(update_best(best, a, {{"eval_loss", 2.5}}, 4));
  EXPECT_FALSE(update_best(best, a, {{"eval_loss", 2.0}}, 6));  // ties keep the first (strict)
  EXPECT_TRUE(update_best(best, a, {{"eval_loss", 1.5}}, 8));
  EXPECT_EQ(best.step, 8);
  EXPECT_DOUBLE_EQ(*best.metric, 1.5);
  best.checkpoint = "out/checkpoint-8";
  const BestModel back = best_from_json(best_to_json(best), "state");
  EXPECT_EQ(back.step, 8);
  EXPECT_EQ(back.checkpoint, "out/checkpoint-8");
  EXPECT_FALSE(best_from_json(nullptr, "state").metric);
  EXPECT_THROW(best_from_json({{"metric", "x"}}, "state"), Error);
  a.metric_for_best_model = "accuracy";
  try {
    update_best(best, a, {{"eval_loss", 1.0}, {"eval_margin", 0.5}, {"eval_runtime", 0.1}}, 10);
    ADD_FAILURE() << "no error for a metric the evaluation lacks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "option --metric_for_best_model accuracy: the evaluation logs no eval_accuracy "
                  "(it logs: loss, margin)"),
              std::string::npos)
        << e.what();
  }
}

TEST(RotateCheckpoints, KeepsTheBestAndTheNewest) {
  const std::string out = testing::temp_dir("rotate_best");
  for (int64_t s : {1, 2, 3, 4}) write_checkpoint(out, s, [](const std::string&) {});
  rotate_checkpoints(out, 1, out + "/checkpoint-2");
  std::vector<int64_t> left;
  for (const auto& [s, p] : list_checkpoints(out)) left.push_back(s);
  EXPECT_EQ(left, (std::vector<int64_t>{2, 4}));
  write_checkpoint(out, 5, [](const std::string&) {});
  rotate_checkpoints(out, 2, out + "/checkpoint-2");
  left.clear();
  for (const auto& [s, p] : list_checkpoints(out)) left.push_back(s);
  EXPECT_EQ(left, (std::vector<int64_t>{2, 5}));
  rotate_checkpoints(out, 1, "");
  left.clear();
  for (const auto& [s, p] : list_checkpoints(out)) left.push_back(s);
  EXPECT_EQ(left, (std::vector<int64_t>{5}));
}

std::vector<nlohmann::json> records(const std::string& metrics_jsonl) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics_jsonl);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// TRL's SFT evaluation with one example per batch: each batch's mean loss, entropy and top-1
// share over its label tokens, averaged over batches; recomputed here from the full logits in
// double.
TEST(Evaluation, SftMetricsMatchFullLogitsInDouble) {
  const std::string model = make_tiny_model(testing::temp_dir("eval_model"));
  const std::string data = testing::fixture_path("datasets/tokenized.jsonl");
  const std::string out = testing::temp_dir("eval_sft");
  SftRun run = make_sft_run(testing::tiny_sft_options(
      model, out,
      {"--dataset", data, "--eval_dataset", data, "--per_device_eval_batch_size", "1",
       "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "3", "--max_steps",
       "1", "--learning_rate", "0", "--eval_on_start"}));
  const TrainResult r = run.trainer->train();
  ASSERT_TRUE(r.final_eval.is_object());
  double loss = 0, entropy = 0, accuracy = 0;
  int64_t n = 0;
  std::ifstream in(data);
  std::string line;
  NoGradGuard ng;
  while (std::getline(in, line)) {
    const std::vector<int64_t> ids = nlohmann::json::parse(line)["input_ids"];
    const int64_t t = static_cast<int64_t>(ids.size());
    std::vector<int64_t> pos(ids.size());
    for (int64_t i = 0; i < t; ++i) pos[i] = i;
    BatchStats st;
    st.sequences = 1;
    st.real_tokens = t;
    const Batch b = host_batch(ids, pos, ids, {0, static_cast<int32_t>(t)}, t, st);
    ForwardOptions fo;
    fo.need_logits = true;
    fo.fused_loss = false;
    const std::vector<double> z = run.model->forward(b, fo).logits.to_f64();
    const int64_t v = static_cast<int64_t>(z.size()) / t;
    double nll = 0, ent = 0, hits = 0;
    for (int64_t i = 0; i + 1 < t; ++i) {
      const double* row = z.data() + i * v;
      double m = row[0];
      int64_t arg = 0;
      for (int64_t j = 1; j < v; ++j)
        if (row[j] > m) m = row[j], arg = j;
      double s = 0, sz = 0;
      for (int64_t j = 0; j < v; ++j) {
        s += std::exp(row[j] - m);
        sz += std::exp(row[j] - m) * row[j];
      }
      const double lse = m + std::log(s);
      nll += lse - row[ids[i + 1]];
      ent += lse - sz / s;
      hits += arg == ids[i + 1] ? 1 : 0;
    }
    // A one-token example has no trainable token: the loader drops it (and says so).
    if (t < 2) continue;
    loss += nll / static_cast<double>(t - 1);
    entropy += ent / static_cast<double>(t - 1);
    accuracy += hits / static_cast<double>(t - 1);
    ++n;
  }
  ASSERT_EQ(n, 3);
  const nlohmann::json& ev = r.final_eval;
  EXPECT_NEAR(ev["eval_loss"].get<double>(), loss / n, 1e-5 * loss / n);
  EXPECT_NEAR(ev["eval_entropy"].get<double>(), entropy / n, 1e-5 * entropy / n);
  EXPECT_NEAR(ev["eval_mean_token_accuracy"].get<double>(), accuracy / n, 1e-12);
  EXPECT_EQ(ev["step"], 1);
  EXPECT_DOUBLE_EQ(*r.final_eval_loss, ev["eval_loss"].get<double>());
  // Training logs TRL's entropy and mean_token_accuracy too, from the fused loss's row
  // statistics: the update's three micro-batches are the three examples, one each.
  nlohmann::json train;
  for (const auto& rec : records(out + "/metrics.jsonl"))
    if (rec.contains("learning_rate")) train = rec;
  ASSERT_TRUE(train.contains("entropy")) << train.dump();
  EXPECT_NEAR(train["entropy"].get<double>(), entropy / n, 1e-5 * entropy / n);
  EXPECT_NEAR(train["mean_token_accuracy"].get<double>(), accuracy / n, 1e-12);
}

struct EvalCase {
  std::string algorithm, data, metric, extra;
};

// With learning rate 0 and every row in one batch, the evaluation before the first update sees
// what that update's forward saw: eval_<m> equals the logged <m> for every metric of the
// trainer (its training metrics are compared with TRL in their own tests). The online trainers
// generate greedily (top_k 1) from one prompt, so the evaluation batch's completions are the
// generation batch's whatever the seeds.
class EvalMatchesTraining : public ::testing::TestWithParam<EvalCase> {};

constexpr const char* kOnline =
    "--top_k 1 --reward_funcs soft_overlong_punishment --soft_punish_cache 2 --logging_steps 1";

TEST_P(EvalMatchesTraining, OnTheSameRowsWithoutAnUpdate) {
  const EvalCase& c = GetParam();
  const std::string model = make_tiny_model(testing::temp_dir("eval_model_" + c.algorithm));
  const std::string out = testing::temp_dir("eval_" + c.algorithm);
  std::string data = std::string(LT_SOURCE_DIR) + "/data/embedded/" + c.data;
  if (c.data == "one_prompt") {
    data = out + "/prompts.jsonl";
    std::ofstream(data) << "{\"prompt\": \"Add 2 and 3.\", \"answer\": \"5\"}\n";
  }
  std::string log;
  ASSERT_EQ(run_command(trainer_bin() + " " + c.algorithm + " --model_name_or_path " + model +
                            " --dataset " + data + " --eval_dataset " + data +
                            " --max_steps 1 --learning_rate 0 --per_device_train_batch_size 128"
                            " --per_device_eval_batch_size 128 --eval_on_start --device cpu " +
                            c.extra + " --output_dir " + out + "/run 2>&1",
                        &log),
            0)
      << log;
  const std::vector<nlohmann::json> rec = records(out + "/run/metrics.jsonl");
  ASSERT_GE(rec.size(), 3u) << log;
  const nlohmann::json& ev = rec[0];
  const nlohmann::json& train = rec[1];
  ASSERT_EQ(ev["step"], 0);
  ASSERT_TRUE(ev.contains("eval_" + c.metric)) << ev.dump();
  int compared = 0;
  for (const auto& [k, v] : train.items()) {
    const std::string key = k == "loss" ? "eval_loss" : "eval_" + k;
    if (!v.is_number() || !ev.contains(key)) continue;
    EXPECT_NEAR(ev[key].get<double>(), v.get<double>(), 1e-6 * (1 + std::abs(v.get<double>())))
        << c.algorithm << " " << k;
    ++compared;
  }
  EXPECT_GE(compared, 6) << ev.dump() << "\n" << train.dump();
  // The evaluation line prints like the training line.
  EXPECT_NE(log.find("eval step 0 | loss "), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(
    Trainers, EvalMatchesTraining,
    ::testing::Values(
        EvalCase{"dpo", "preferences.jsonl", "rewards/margins", ""},
        EvalCase{"kto", "unpaired.jsonl", "kl", ""},
        EvalCase{"reward", "preferences.jsonl", "accuracy", ""},
        EvalCase{"grpo", "one_prompt", "completions/mean_length",
                 std::string(kOnline) +
                     " --max_completion_length 6"
                     " --per_device_train_batch_size 8 --per_device_eval_batch_size 8"},
        EvalCase{"rloo", "one_prompt", "kl",
                 std::string(kOnline) +
                     " --max_completion_length 6"
                     " --per_device_train_batch_size 2 --per_device_eval_batch_size 2"},
        EvalCase{"online_dpo", "one_prompt", "objective/kl",
                 std::string(kOnline) +
                     " --max_new_tokens 6"
                     " --per_device_train_batch_size 1 --per_device_eval_batch_size 1"}),
    [](const auto& info) { return info.param.algorithm; });

nlohmann::json without_timing(nlohmann::json history) {
  for (auto& r : history)
    for (const char* k : {"eval_runtime", "tokens_per_second", "mfu"}) r.erase(k);
  return history;
}

// load_best_model_at_end writes the best checkpoint's weights; trainer_state.json holds exactly
// transformers' TrainerState fields; a resumed run's log_history continues the one it resumed.
TEST(Evaluation, BestModelAtEndAndTrainerStateForTransformers) {
  const std::string model = make_tiny_model(testing::temp_dir("eval_best_model"));
  const std::string out = testing::temp_dir("eval_best");
  const std::vector<std::string> common = {"--eval_dataset",
                                           testing::small_dataset(),
                                           "--per_device_eval_batch_size",
                                           "8",
                                           "--eval_steps",
                                           "2",
                                           "--save_steps",
                                           "2",
                                           "--max_steps",
                                           "6",
                                           "--learning_rate",
                                           "1e-2",
                                           "--metric_for_best_model",
                                           "loss",
                                           "--greater_is_better",
                                           "true"};
  std::vector<std::string> args = common;
  args.insert(args.end(), {"--load_best_model_at_end", "--save_total_limit", "1"});
  SftRun run = make_sft_run(testing::tiny_sft_options(model, out, args));
  const TrainResult r = run.trainer->train();
  // The largest eval loss wins (greater_is_better): the first evaluation's, at step 2.
  std::vector<double> evals;
  for (const auto& rec : records(out + "/metrics.jsonl"))
    if (rec.contains("eval_loss")) evals.push_back(rec["eval_loss"]);
  ASSERT_EQ(evals.size(), 4u);  // steps 2, 4, 6, then the best model's
  EXPECT_GT(evals[0], evals[1]);
  EXPECT_DOUBLE_EQ(evals[3], evals[0]);
  EXPECT_DOUBLE_EQ(*r.final_eval_loss, evals[0]);
  // Rotation kept the best (checkpoint-2) beside the newest.
  std::vector<int64_t> left;
  for (const auto& [s, p] : list_checkpoints(out)) left.push_back(s);
  EXPECT_EQ(left, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(testing::read_file(out + "/model.safetensors"),
            testing::read_file(out + "/checkpoint-2/model.safetensors"));

  const nlohmann::json fields = nlohmann::json::parse(
      testing::read_file(testing::fixture_path("trainer/trainer_state_fields.json")))["fields"];
  const nlohmann::json st =
      nlohmann::json::parse(testing::read_file(out + "/checkpoint-4/trainer_state.json"));
  std::set<std::string> want(fields.begin(), fields.end()), have;
  for (const auto& [k, v] : st.items()) have.insert(k);
  EXPECT_EQ(have, want);
  EXPECT_EQ(st["global_step"], 4);
  EXPECT_EQ(st["max_steps"], 6);
  EXPECT_EQ(st["best_global_step"], 2);
  EXPECT_EQ(st["best_model_checkpoint"], out + "/checkpoint-2");
  EXPECT_DOUBLE_EQ(st["best_metric"].get<double>(), evals[0]);
  EXPECT_EQ(st["log_history"].size(), 6u);                 // 4 training records, 2 evaluations
  EXPECT_EQ(st["log_history"][2]["eval_loss"], evals[0]);  // after the records of steps 1, 2

  // Resumed from checkpoint-2 (without load_best): checkpoint-4's history is the straight run's.
  const std::string straight = testing::temp_dir("eval_straight");
  const std::string resumed = testing::temp_dir("eval_resumed");
  make_sft_run(testing::tiny_sft_options(model, straight, common)).trainer->train();
  {
    SftRun first = make_sft_run(testing::tiny_sft_options(model, resumed, common));
    first.trainer->set_stop_after(2);
    first.trainer->train();
  }
  std::vector<std::string> again = common;
  again.insert(again.end(), {"--resume_from_checkpoint", resumed + "/checkpoint-2"});
  make_sft_run(testing::tiny_sft_options(model, resumed, again)).trainer->train();
  const nlohmann::json a = nlohmann::json::parse(
      testing::read_file(straight + "/checkpoint-4/trainer_state.json"))["log_history"];
  const nlohmann::json b = nlohmann::json::parse(
      testing::read_file(resumed + "/checkpoint-4/trainer_state.json"))["log_history"];
  EXPECT_EQ(without_timing(a), without_timing(b));
}

// logging_steps, eval_steps and save_steps below 1 are ratios of all updates (transformers):
// with 8 updates, 0.25 logs and evaluates every 2 and 0.5 saves every 4; trainer_state.json holds
// the resolved counts.
TEST(Evaluation, StepRatiosResolveAgainstTheTotal) {
  const std::string model = make_tiny_model(testing::temp_dir("ratio_model"));
  const std::string out = testing::temp_dir("ratio_out");
  SftRun run = make_sft_run(testing::tiny_sft_options(
      model, out,
      {"--max_steps", "8", "--logging_steps", "0.25", "--eval_dataset", testing::small_dataset(),
       "--eval_steps", "0.25", "--save_steps", "0.5", "--per_device_eval_batch_size", "32"}));
  run.trainer->train();
  std::vector<int64_t> logged, evaluated;
  for (const auto& r : records(out + "/metrics.jsonl"))
    (r.contains("eval_loss") ? evaluated : logged).push_back(r["step"]);
  EXPECT_EQ(logged, (std::vector<int64_t>{2, 4, 6, 8}));
  EXPECT_EQ(evaluated, (std::vector<int64_t>{2, 4, 6, 8}));
  std::vector<int64_t> saved;
  for (const auto& [s, p] : list_checkpoints(out)) saved.push_back(s);
  EXPECT_EQ(saved, (std::vector<int64_t>{4}));
  const nlohmann::json st =
      nlohmann::json::parse(testing::read_file(out + "/checkpoint-4/trainer_state.json"));
  EXPECT_EQ(st["logging_steps"], 2);
  EXPECT_EQ(st["eval_steps"], 2);
  EXPECT_EQ(st["save_steps"], 4);
}

// reduce_lr_on_plateau steps on every evaluation during training (not the one on start): in
// mode max a falling eval loss is never an improvement, so with patience 0 each evaluation after
// the first halves the rate; a run resumed from checkpoint-2 continues the same rates.
TEST(Evaluation, ReduceLrOnPlateauStepsOnEvaluationsAndResumes) {
  const std::string model = make_tiny_model(testing::temp_dir("plateau_model"));
  const std::vector<std::string> common = {"--eval_dataset",
                                           testing::small_dataset(),
                                           "--per_device_eval_batch_size",
                                           "16",
                                           "--eval_steps",
                                           "1",
                                           "--eval_on_start",
                                           "--save_steps",
                                           "2",
                                           "--max_steps",
                                           "4",
                                           "--lr_scheduler_type",
                                           "reduce_lr_on_plateau",
                                           "--lr_scheduler_kwargs",
                                           "{\"mode\": \"max\", \"patience\": 0, \"factor\": 0.5}"};
  auto rates = [](const std::string& out) {
    std::vector<double> lr;
    for (const auto& r : records(out + "/metrics.jsonl"))
      if (r.contains("learning_rate")) lr.push_back(r["learning_rate"]);
    return lr;
  };
  const std::string straight = testing::temp_dir("plateau_straight");
  make_sft_run(testing::tiny_sft_options(model, straight, common)).trainer->train();
  EXPECT_EQ(rates(straight), (std::vector<double>{1e-3, 1e-3, 5e-4, 2.5e-4}));
  const std::string resumed = testing::temp_dir("plateau_resumed");
  {
    SftRun first = make_sft_run(testing::tiny_sft_options(model, resumed, common));
    first.trainer->set_stop_after(2);
    first.trainer->train();
  }
  std::vector<std::string> again = common;
  again.insert(again.end(), {"--resume_from_checkpoint", "latest"});
  make_sft_run(testing::tiny_sft_options(model, resumed, again)).trainer->train();
  EXPECT_EQ(rates(resumed), rates(straight));
  Options o = sft_options();
  o.parse({"--lr_scheduler_type", "reduce_lr_on_plateau"});
  EXPECT_THROW(training_arguments(o), Error);
}

}  // namespace
}  // namespace leantune
