// DPO: parity with TRL 1.16's DPOTrainer (tests/fixtures/gen_dpo_fixtures.py: loss and metrics
// of every loss_type within 1e-5 relative, the first step's gradient), padded == padding-free,
// the reference modes' memory (allocator stats), the built-in demo, and bad input through
// trainer_bin (exit 2, one line naming the row or option).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/allocator.h"
#include "engine/ops.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "testing/testing.h"
#include "trainers/dpo/dpo.h"
#include "trainers/estimate/estimate_pref.h"
#include "trainers/trainer_test_util.h"

namespace leantune {
namespace {

using testing::run_command;
using testing::trainer_bin;

nlohmann::json fixture_meta() {
  return nlohmann::json::parse(read_text_file(testing::fixture_path("dpo/cases.json")));
}

PreferenceData fixture_pairs(const nlohmann::json& meta) {
  PreferenceData d;
  int64_t line = 1;
  for (const auto& p : meta["pairs"]) {
    PreferenceExample ex;
    ex.prompt_ids = p["prompt_ids"].get<std::vector<int32_t>>();
    ex.chosen_ids = p["chosen_ids"].get<std::vector<int32_t>>();
    ex.rejected_ids = p["rejected_ids"].get<std::vector<int32_t>>();
    ex.line = line++;
    d.examples.push_back(ex);
  }
  d.stats.examples = static_cast<int64_t>(d.examples.size());
  return d;
}

// A DpoTrainer on the fixture's policy and reference with the case's loss options.
struct FixtureRun {
  std::shared_ptr<DecoderModel> model;
  std::unique_ptr<DpoTrainer> trainer;
};

FixtureRun fixture_run(const nlohmann::json& c, bool padding_free, bool fused,
                       const std::string& ref_mode = "ref_model") {
  FixtureRun r;
  r.model = std::shared_ptr<DecoderModel>(DecoderModel::load(
      testing::fixture_path("models/qwen2_tied/model"), Device::cpu(), DType::kF32));
  r.model->set_requires_grad(true);
  Options o = dpo_options();
  o.parse({"--output_dir", testing::temp_dir("dpo_fixture"), "--device", "cpu"});
  PreferenceLossConfig lc;
  lc.loss_types = c["loss_type"].get<std::vector<std::string>>();
  if (c.contains("loss_weights")) lc.loss_weights = c["loss_weights"].get<std::vector<double>>();
  lc.beta = c.value("beta", 0.1);
  lc.label_smoothing = c.value("label_smoothing", 0.0);
  lc.f_divergence_type = c.value("f_divergence_type", std::string("reverse_kl"));
  lc.f_alpha_divergence_coef = c.value("f_alpha_divergence_coef", 0.5);
  validate_preference_loss(lc);
  DpoDataConfig dd;
  dd.max_length = 0;
  dd.padding_free = padding_free;
  SequenceLogpsOptions lo;
  lo.fused = fused;
  lo.chunk_tokens = 5;  // several chunks, pieces of several sequences in one chunk
  r.trainer = std::make_unique<DpoTrainer>(training_arguments(o), r.model, o, "",
                                           fixture_pairs(fixture_meta()), dd, lc, lo);
  RefModelConfig rc;
  if (ref_mode == "ref_model") rc.ref_model = testing::fixture_path("dpo/ref_model");
  if (ref_mode == "precompute") {
    rc.ref_model = testing::fixture_path("dpo/ref_model");
    rc.precompute = true;
    rc.precompute_batch_size = 2;
  }
  r.trainer->set_reference(rc);
  return r;
}

double rel(double a, double e) { return std::abs(a - e) / std::max(std::abs(e), 1e-12); }

class DpoParity : public ::testing::TestWithParam<std::string> {};

TEST_P(DpoParity, LossMetricsAndFirstStepGradientMatchTrl) {
  const nlohmann::json meta = fixture_meta();
  nlohmann::json c;
  for (const auto& x : meta["cases"])
    if (x["name"] == GetParam()) c = x;
  ASSERT_FALSE(c.is_null()) << GetParam();
  auto ref = SafetensorsFile::open(testing::fixture_path("dpo/cases.safetensors"));
  FixtureRun run = fixture_run(c, /*padding_free=*/false, /*fused=*/true);
  PreferenceLossResult res;
  nlohmann::json metrics;
  const PairBatch pb = collate_pairs(fixture_pairs(meta).examples, {0, 1, 2}, DpoDataConfig{0});
  Tensor loss = run.trainer->pairs_loss(pb, 1.0, &res, &metrics);
  const double want = c["loss"].get<double>();
  EXPECT_LE(rel(loss.item(), want), 1e-5) << loss.item() << " vs TRL " << want;
  EXPECT_LE(rel(res.loss, want), 1e-5);
  for (auto it = c["metrics"].begin(); it != c["metrics"].end(); ++it) {
    ASSERT_TRUE(metrics.contains(it.key())) << it.key();
    const double e = it.value().get<double>(), a = metrics[it.key()].get<double>();
    EXPECT_LE(std::abs(a - e), 1e-5 * std::abs(e) + 1e-7) << it.key() << ": " << a << " vs " << e;
  }
  loss.backward();
  std::set<std::string> keys;
  for (const auto& e : ref->entries()) keys.insert(e.name);
  int checked = 0;
  for (const auto& [name, p] : run.model->named_parameters()) {
    const std::string key = GetParam() + ".grad." + name;
    if (!keys.count(key)) continue;
    const Tensor e = ref->tensor(key);
    const double scale = ops::max_abs(e);
    EXPECT_TRUE(testing::all_close(p.grad(), e, 1e-4 * scale + 1e-9, 1e-4)) << name;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

INSTANTIATE_TEST_SUITE_P(TrlCases, DpoParity,
                         ::testing::Values("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair",
                                           "robust", "bco_pair", "sppo_hard", "apo_zero",
                                           "apo_down", "sft", "sigmoid_norm",
                                           "sigmoid_sft_weighted", "forward_kl", "js_divergence",
                                           "alpha_divergence", "beta_0.5"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (ch == '.') ch = '_';
                           return n;
                         });

// Every variant of the batch layout and LM-head path gives the same loss and gradient.
TEST(Dpo, PaddingFreeAndUnchunkedGiveTheSameLossAndGradient) {
  const nlohmann::json meta = fixture_meta();
  const nlohmann::json c = meta["cases"][0];
  std::vector<double> losses;
  std::vector<Tensor> grads;
  for (int v = 0; v < 3; ++v) {
    FixtureRun run = fixture_run(c, /*padding_free=*/v == 1, /*fused=*/v != 2);
    DpoDataConfig dd{0};
    dd.padding_free = v == 1;
    const PairBatch pb = collate_pairs(fixture_pairs(meta).examples, {0, 1, 2}, dd);
    if (v == 1) {
      EXPECT_EQ(pb.batch.stats.pad_tokens, 0);
    } else {
      EXPECT_GT(pb.batch.stats.pad_tokens, 0);
    }
    Tensor loss = run.trainer->pairs_loss(pb, 1.0, nullptr, nullptr);
    loss.backward();
    losses.push_back(loss.item());
    grads.push_back(run.model->embed_tokens().grad().clone(MemTag::kOther));
  }
  for (int v = 1; v < 3; ++v) {
    EXPECT_LE(rel(losses[v], losses[0]), 1e-6) << v;
    EXPECT_TRUE(testing::all_close(grads[v], grads[0], 1e-6 * ops::max_abs(grads[0]), 1e-5)) << v;
  }
}

int64_t param_bytes() {
  return allocator(Device::cpu()).stats().by_tag[static_cast<int>(MemTag::kParam)].current;
}

TEST(Dpo, PrecomputedReferenceHoldsNoWeightsAndMatchesTheLiveOne) {
  const nlohmann::json meta = fixture_meta();
  const nlohmann::json c = meta["cases"][0];
  const int64_t none = param_bytes();
  FixtureRun live = fixture_run(c, false, true, "ref_model");
  const int64_t with_ref = param_bytes() - none;
  const int64_t ref_bytes = live.trainer->reference().held_bytes();
  EXPECT_GT(ref_bytes, 0);
  const double live_loss = live.trainer->evaluate_pairs({0, 1, 2}).loss;
  live = FixtureRun{};
  ASSERT_EQ(param_bytes(), none);
  FixtureRun pre = fixture_run(c, false, true, "precompute");
  // After the pass only the policy's weights are held: the reference model was freed.
  EXPECT_TRUE(pre.trainer->reference().precomputed());
  EXPECT_EQ(pre.trainer->reference().held_bytes(), 0);
  EXPECT_EQ(param_bytes() - none, with_ref - ref_bytes);
  EXPECT_LE(rel(pre.trainer->evaluate_pairs({0, 1, 2}).loss, live_loss), 1e-6);
}

// Parameter bytes (allocator, tag param) held once a run of the tiny model on the built-in
// preference set is set up, and its reference mode; the run then trains one step.
int64_t run_param_bytes(const std::vector<std::string>& extra, RefMode* mode) {
  const std::string model = testing::make_tiny_model(testing::temp_dir("dpo_model"));
  std::vector<std::string> args = {"--model_name_or_path",
                                   model,
                                   "--dataset",
                                   std::string(LT_SOURCE_DIR) + "/data/embedded/preferences.jsonl",
                                   "--output_dir",
                                   testing::temp_dir("dpo_out"),
                                   "--device",
                                   "cpu",
                                   "--max_steps",
                                   "1",
                                   "--per_device_train_batch_size",
                                   "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  Options o = dpo_options();
  o.parse(args);
  const int64_t before = param_bytes();
  DpoRun run = make_dpo_run(o);
  *mode = run.trainer->reference().mode();
  const int64_t held = param_bytes() - before;
  run.trainer->train();
  EXPECT_EQ(param_bytes() - before, held) << "training changed the parameter bytes";
  return held;
}

TEST(Dpo, UsePeftWithoutRefModelHoldsOneCopyOfTheBase) {
  RefMode pre, full, peft;
  // Precomputed: the policy alone (the copy that computed the reference is freed).
  const int64_t one = run_param_bytes({"--precompute_ref_log_probs", "true"}, &pre);
  EXPECT_EQ(pre, RefMode::kPrecomputed);
  // Full fine-tuning without ref_model: a second copy.
  EXPECT_EQ(run_param_bytes({}, &full), 2 * one);
  EXPECT_EQ(full, RefMode::kPolicyCopy);
  // LoRA without ref_model: one copy of the base plus the adapters (a few KiB).
  const int64_t lora = run_param_bytes({"--use_peft", "true"}, &peft);
  EXPECT_EQ(peft, RefMode::kAdaptersOff);
  EXPECT_GE(lora, one);
  EXPECT_LT(lora - one, 16 << 10);
  // QLoRA: the NF4 base is the reference with the adapters off; still one (smaller) copy.
  RefMode qlora;
  const int64_t nf4 = run_param_bytes({"--use_peft", "true", "--load_in_4bit", "true"}, &qlora);
  EXPECT_EQ(qlora, RefMode::kAdaptersOff);
  EXPECT_LT(nf4, lora);
}

// trainer_bin estimate dpo: the reference modes differ by exactly the reference weights.
TEST(Dpo, EstimateCoversEachReferenceMode) {
  const ModelConfig m =
      ModelConfig::load(std::string(LT_SOURCE_DIR) + "/data/embedded/config.json");
  auto est = [&](const std::vector<std::string>& extra) {
    Options o = dpo_options("estimate dpo");
    std::vector<std::string> a = {"--device", "cpu", "--max_length", "64"};
    a.insert(a.end(), extra.begin(), extra.end());
    o.parse(a);
    return estimate_dpo_from_options(o, m, true);
  };
  const PreferenceEstimate pre = est({"--precompute_ref_log_probs", "true"});
  const PreferenceEstimate copy = est({});
  const PreferenceEstimate lora = est({"--use_peft", "true"});
  const PreferenceEstimate nf4 = est(
      {"--ref_model", std::string(LT_SOURCE_DIR) + "/data/embedded", "--ref_load_in_4bit", "true"});
  EXPECT_EQ(pre.reference_mode, "precomputed");
  EXPECT_EQ(pre.reference_params, 0);
  EXPECT_EQ(copy.reference_mode, "policy_copy");
  EXPECT_EQ(copy.reference_params, copy.policy.params);
  EXPECT_EQ(copy.peak, pre.peak + copy.policy.params);
  EXPECT_EQ(lora.reference_mode, "adapters_off");
  EXPECT_EQ(lora.reference_params, 0);
  EXPECT_EQ(nf4.reference_mode, "ref_model");
  EXPECT_GT(nf4.reference_params, 0);
  EXPECT_LT(nf4.reference_params, copy.reference_params / 2);
  // Chosen and rejected: twice the tokens of an sft micro-batch.
  EXPECT_GT(pre.policy.activations, 0);
}

// The loss of a micro-batch is its share of the accumulated batch's pair mean: 2 x 2 pairs with
// accumulation give the losses and weights of one batch of 4 (trainer_bin, fresh processes).
// Also checks loss_weights given as JSON numbers in a config.
TEST(Dpo, AccumulationOf2x2EqualsOneBatchOf4) {
  const std::string model = testing::make_tiny_model(testing::temp_dir("dpo_acc_model"));
  const std::string cfg = testing::temp_dir("dpo_acc_cfg") + "/c.json";
  std::ofstream(cfg) << R"({"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.25]})";
  const std::string common = " dpo --config " + cfg + " --model_name_or_path " + model +
                             " --dataset " + LT_SOURCE_DIR +
                             "/data/embedded/preferences.jsonl --device cpu --max_steps 3 "
                             "--logging_steps 1 --save_steps 0 --learning_rate 1e-3 --seed 5";
  std::vector<std::vector<std::pair<int64_t, double>>> losses;
  for (const char* shape : {" --per_device_train_batch_size 4 --gradient_accumulation_steps 1",
                            " --per_device_train_batch_size 2 --gradient_accumulation_steps 2"}) {
    const std::string out = testing::temp_dir("dpo_acc_out");
    std::string log;
    ASSERT_EQ(run_command(trainer_bin() + common + shape + " --output_dir " + out + " 2>&1", &log),
              0)
        << log;
    losses.push_back(testing::read_losses(out + "/metrics.jsonl"));
  }
  ASSERT_EQ(losses[0].size(), 3u);
  ASSERT_EQ(losses[1].size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(losses[1][i].second, losses[0][i].second, 2e-5 * std::abs(losses[0][i].second))
        << "step " << i + 1;
  // The weights changed the loss (a step 1 loss of sigmoid alone would be log 2).
  EXPECT_GT(std::abs(losses[0][0].second - std::log(2.0)), 1e-3);
}

// A resumed run continues the straight run's losses bit for bit (full fine-tuning: the
// reference copy is taken from the initial weights before the checkpoint loads; and with the
// precomputed reference).
TEST(Dpo, ResumeIsBitExactInAFreshProcess) {
  namespace fs = std::filesystem;
  const std::string model = testing::make_tiny_model(testing::temp_dir("dpo_res_model"));
  for (const char* extra : {"", " --precompute_ref_log_probs true"}) {
    const std::string straight = testing::temp_dir("dpo_straight"),
                      resumed = testing::temp_dir("dpo_resumed");
    const std::string common = std::string(" dpo --model_name_or_path ") + model + " --dataset " +
                               LT_SOURCE_DIR +
                               "/data/embedded/preferences.jsonl --device cpu --max_steps 8 "
                               "--logging_steps 1 --learning_rate 1e-3 --seed 5 "
                               "--per_device_train_batch_size 4" +
                               extra;
    std::string log;
    ASSERT_EQ(
        run_command(trainer_bin() + common + " --save_steps 4 --output_dir " + straight + " 2>&1",
                    &log),
        0)
        << log;
    fs::copy(straight + "/checkpoint-4", resumed + "/checkpoint-4", fs::copy_options::recursive);
    ASSERT_EQ(run_command(trainer_bin() + common + " --save_steps 0 --output_dir " + resumed +
                              " --resume_from_checkpoint latest 2>&1",
                          &log),
              0)
        << log;
    auto a = testing::read_losses(straight + "/metrics.jsonl"),
         b = testing::read_losses(resumed + "/metrics.jsonl");
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b[i].second, a[4 + i].second) << "step " << i + 5;
    EXPECT_EQ(testing::read_file(straight + "/model.safetensors"),
              testing::read_file(resumed + "/model.safetensors"));
  }
}

// Old DPO truncation: the prompt keeps its last max_prompt_length tokens, completions their
// first max_completion_length, then max_length by truncation_mode; truncated and dropped pairs
// are counted in the data report.
TEST(Dpo, TruncationIsAppliedAndCounted) {
  const std::string model = testing::make_tiny_model(testing::temp_dir("dpo_tr_model"));
  auto run = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "--model_name_or_path",
        model,
        "--dataset",
        std::string(LT_SOURCE_DIR) + "/data/embedded/preferences.jsonl",
        "--output_dir",
        testing::temp_dir("dpo_tr_out"),
        "--device",
        "cpu",
        "--max_steps",
        "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    Options o = dpo_options();
    o.parse(args);
    return make_dpo_run(o);
  };
  DpoRun full = run({});
  EXPECT_EQ(full.trainer->train_stats().truncated_examples, 0);
  const int64_t pairs = full.trainer->train_stats().examples;
  DpoRun cut =
      run({"--max_prompt_length", "4", "--max_completion_length", "6", "--max_length", "9"});
  const DataStats& st = cut.trainer->train_stats();
  EXPECT_EQ(st.examples, pairs);
  EXPECT_EQ(st.truncated_examples, pairs);
  EXPECT_GT(st.truncated_tokens, 0);
  EXPECT_NE(st.summary().find("truncated"), std::string::npos) << st.summary();
  // keep_start with max_length at or below the prompt: no completion token survives, every pair
  // is dropped and counted, and a run with nothing left is refused.
  try {
    run({"--max_length", "3"});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(
        std::string(e.what()).find(std::to_string(pairs) + " dropped with no trainable token"),
        std::string::npos)
        << e.what();
  }
}

// Training on from a PEFT adapter folder: the reference is the adapter as loaded (TRL's "ref"
// copy), so before any update the policy equals it: rewards 0, sigmoid loss log 2; after a
// step the trained adapter differs from it while the reference stays.
TEST(Dpo, AdapterFolderReferenceIsTheAdapterAsLoaded) {
  const std::string model = testing::make_tiny_model(testing::temp_dir("dpo_ad_model"));
  const std::string data = std::string(LT_SOURCE_DIR) + "/data/embedded/preferences.jsonl";
  const std::string first = testing::temp_dir("dpo_ad_first");
  std::string log;
  ASSERT_EQ(
      run_command(trainer_bin() + " dpo --model_name_or_path " + model + " --dataset " + data +
                      " --use_peft true --learning_rate 3e-2 --max_steps 3 "
                      "--save_steps 0 --device cpu --output_dir " +
                      first + " 2>&1",
                  &log),
      0)
      << log;
  Options o = dpo_options();
  o.parse({"--model_name_or_path", first, "--dataset", data, "--output_dir",
           testing::temp_dir("dpo_ad_second"), "--device", "cpu", "--max_steps", "2",
           "--learning_rate", "3e-2", "--per_device_train_batch_size", "4"});
  DpoRun run = make_dpo_run(o);
  EXPECT_EQ(run.trainer->reference().mode(), RefMode::kInitialAdapter);
  const PreferenceLossResult r0 = run.trainer->evaluate_pairs({0, 1, 2, 3});
  EXPECT_EQ(r0.rewards_margins, 0.0);
  EXPECT_NEAR(r0.loss, std::log(2.0), 1e-12);
  run.trainer->train();
  const PreferenceLossResult r1 = run.trainer->evaluate_pairs({0, 1, 2, 3});
  EXPECT_GT(std::abs(r1.rewards_margins), 1e-4);
  // The adapters-off reference (a fresh adapter on the same base) would not be zero at start.
  Options fresh = dpo_options();
  fresh.parse({"--model_name_or_path", model, "--dataset", data, "--output_dir",
               testing::temp_dir("dpo_ad_fresh"), "--device", "cpu", "--use_peft", "true"});
  EXPECT_EQ(make_dpo_run(fresh).trainer->reference().mode(), RefMode::kAdaptersOff);
}

TEST(Dpo, DemoReachesRewardAccuracyAboveNinety) {
  const std::string out = testing::temp_dir("dpo_demo");
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() + " dpo --device cpu 2>&1", &log), 0)
      << log;
  std::ifstream f(out + "/trainer_output/embedded_dpo/metrics.jsonl");
  double last = -1;
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("rewards/accuracies")) last = j["rewards/accuracies"].get<double>();
  }
  EXPECT_GT(last, 0.9) << log;
  EXPECT_NE(log.find("reference model: a frozen copy of the initial policy"), std::string::npos)
      << log;
}

}  // namespace
}  // namespace leantune
