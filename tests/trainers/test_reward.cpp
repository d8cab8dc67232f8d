// Reward models: scores as transformers' *ForSequenceClassification reads them (last non-pad
// token, and the last token without a pad id), RewardTrainer's loss, metrics and first-step
// gradient (tests/fixtures/gen_reward_fixtures.py, TRL 1.16 / transformers 5.23), the data as
// RewardTrainer tokenizes it, padded == padding-free, the classification folder's round trip and
// what transformers/PEFT read from folders we write (scores recorded by the generator's --ours
// checks), LoRA with the score head in modules_to_save, the demo and trainer_bin score.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/rng.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "models/score_head.h"
#include "testing/testing.h"
#include "trainers/common/peft_options.h"
#include "trainers/estimate/estimate_reward.h"
#include "trainers/reward/reward.h"
#include "trainers/trainer_test_util.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::trainer_bin;

const nlohmann::json& meta() {
  static const nlohmann::json m =
      nlohmann::json::parse(read_text_file(testing::fixture_path("reward/cases.json")));
  return m;
}

std::vector<std::vector<int32_t>> sequences() {
  return meta()["sequences"].get<std::vector<std::vector<int32_t>>>();
}

std::shared_ptr<DecoderModel> fixture_model(const std::string& name) {
  return load_sequence_classifier(testing::fixture_path("reward/" + name + "_rm"), Device::cpu(),
                                  DType::kF32, 0, 1);
}

void expect_scores(const std::vector<double>& got, const std::vector<double>& want,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]) + 2e-6) << what << " sequence " << i;
}

std::vector<double> scores_of(const DecoderModel& m, const Batch& b) {
  NoGradGuard ng;
  return sequence_scores(m, b).to(Device::cpu(), DType::kF64, MemTag::kOther).to_f64();
}

TEST(ScoreRows, RightmostNonPadTokenAsTransformersReadsIt) {
  // Sequences of 3, 1, 4 and 2 rows; pad id 0.
  const Batch b = sequences_batch({{5, 6, 0}, {0}, {7, 0, 8, 0}, {9, 9}}, 0, true, 0);
  EXPECT_EQ(score_rows(b, 0), (std::vector<int64_t>{1, 3, 6, 9}));
  // Without a pad id: every sequence's last row.
  EXPECT_EQ(score_rows(b, std::nullopt), (std::vector<int64_t>{2, 3, 7, 9}));
  // Padded to a multiple of 8: the padding never moves the row read.
  const Batch p = sequences_batch({{5, 6, 0}, {0}, {7, 0, 8, 0}, {9, 9}}, 8, false, 0);
  EXPECT_EQ(p.num_tokens(), 32);
  EXPECT_EQ(p.stats.pad_tokens, 22);
  EXPECT_EQ(score_rows(p, 0), (std::vector<int64_t>{1, 8, 18, 25}));
}

class RewardScores : public ::testing::TestWithParam<std::string> {};

TEST_P(RewardScores, MatchTransformersWithAndWithoutPadId) {
  auto m = fixture_model(GetParam());
  EXPECT_EQ(m->config().architecture, GetParam() == "qwen2" ? "Qwen2ForSequenceClassification"
                                                            : "LlamaForSequenceClassification");
  ASSERT_EQ(m->config().pad_token_id, 0);
  const auto& want = meta()["scores"][GetParam()];
  const auto seqs = sequences();
  // One right-padded batch, as transformers ran it, and flat without padding: the same scores.
  expect_scores(scores_of(*m, sequences_batch(seqs, 0, false, 0)),
                want["pad_0"].get<std::vector<double>>(), "padded");
  expect_scores(scores_of(*m, sequences_batch(seqs, 0, true, 0)),
                want["pad_0"].get<std::vector<double>>(), "padding-free");
  expect_scores(scores_of(*m, sequences_batch(seqs, 16, false, 0)),
                want["pad_0"].get<std::vector<double>>(), "pad_to_multiple_of 16");
  m->set_pad_token_id(std::nullopt);
  expect_scores(scores_of(*m, sequences_batch(seqs, 0, true, 0)),
                want["no_pad"].get<std::vector<double>>(), "no pad id");
}

INSTANTIATE_TEST_SUITE_P(Models, RewardScores, ::testing::Values("qwen2", "llama"));

RewardData fixture_pairs(bool margins) {
  RewardData d;
  int64_t line = 1;
  const auto m = meta()["margins"].get<std::vector<double>>();
  for (const auto& p : meta()["pairs"]) {
    RewardPair rp;
    rp.chosen_ids = p["chosen_ids"].get<std::vector<int32_t>>();
    rp.rejected_ids = p["rejected_ids"].get<std::vector<int32_t>>();
    rp.margin = margins ? m[static_cast<size_t>(line - 1)] : 0.0;
    rp.line = line++;
    d.pairs.push_back(rp);
  }
  d.format.kind = DatasetKind::kPreference;
  d.format.has_margin = margins;
  d.stats.examples = static_cast<int64_t>(d.pairs.size());
  return d;
}

struct ParityCase {
  std::string model, name;
  bool padding_free;
};

std::string case_name(const ::testing::TestParamInfo<ParityCase>& i) {
  return i.param.model + "_" + i.param.name + (i.param.padding_free ? "_padding_free" : "");
}

class RewardParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(RewardParity, LossMetricsAndFirstStepGradientMatchTrl) {
  const ParityCase& pc = GetParam();
  nlohmann::json c;
  for (const auto& x : meta()["cases"])
    if (x["model"] == pc.model && x["name"] == pc.name) c = x;
  ASSERT_FALSE(c.is_null());
  auto model = fixture_model(pc.model);
  model->set_requires_grad(true);
  Options o = reward_options();
  o.parse({"--output_dir", testing::temp_dir("reward_fixture"), "--device", "cpu",
           "--gradient_checkpointing", pc.padding_free ? "true" : "false"});
  const bool margins = c.value("margin", false);
  RewardCollateConfig cc;
  cc.padding_free = pc.padding_free;
  const double center = c["center_rewards_coefficient"].is_null()
                            ? 0.0
                            : c["center_rewards_coefficient"].get<double>();
  RewardTrainer t(training_arguments(o), model, o, "", fixture_pairs(margins), std::nullopt, cc,
                  center, true);
  t.set_peft(PeftSetup{}, "", false);
  const RewardData data = fixture_pairs(margins);
  const RewardBatch rb = collate_reward_pairs(data.pairs, {0, 1, 2}, cc);
  RewardLossResult r;
  Tensor loss = t.pairs_loss(rb, 1.0, &r);
  const double want = c["loss"].get<double>();
  EXPECT_NEAR(loss.item(), want, 1e-5 * std::abs(want));
  for (auto it = c["metrics"].begin(); it != c["metrics"].end(); ++it) {
    ASSERT_TRUE(r.metrics.contains(it.key())) << it.key();
    const double e = it.value().get<double>(), a = r.metrics[it.key()].get<double>();
    EXPECT_NEAR(a, e, 1e-5 * std::abs(e) + 2e-6) << it.key();
  }
  loss.backward();
  auto ref = SafetensorsFile::open(testing::fixture_path("reward/cases.safetensors"));
  int checked = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    const std::string key = pc.model + "." + pc.name + ".grad." + name;
    bool present = false;
    for (const auto& e : ref->entries()) present = present || e.name == key;
    if (!present) continue;
    const Tensor e = ref->tensor(key);
    EXPECT_TRUE(testing::all_close(p.grad(), e, 1e-4 * ops::max_abs(e) + 1e-9, 1e-4)) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

INSTANTIATE_TEST_SUITE_P(TrlCases, RewardParity,
                         ::testing::Values(ParityCase{"qwen2", "plain", false},
                                           ParityCase{"qwen2", "margin", false},
                                           ParityCase{"qwen2", "center", false},
                                           ParityCase{"qwen2", "margin_center", true},
                                           ParityCase{"llama", "plain", true},
                                           ParityCase{"llama", "margin", false},
                                           ParityCase{"llama", "center", false},
                                           ParityCase{"llama", "margin_center", false}),
                         case_name);

TEST(RewardLoss, GradientMatchesFiniteDifferences) {
  const std::vector<double> c = {0.3, -1.2, 2.0, 0.0}, r = {0.1, 0.5, -3.0, 0.0};
  const std::vector<double> m = {0.5, -0.25, 1.0, 0.0};
  const RewardLossResult res = reward_loss(c, r, m, 0.3);
  const double h = 1e-6;
  for (size_t i = 0; i < c.size(); ++i) {
    auto cp = c, cm = c, rp = r, rm = r;
    cp[i] += h;
    cm[i] -= h;
    rp[i] += h;
    rm[i] -= h;
    EXPECT_NEAR(res.dchosen[i],
                (reward_loss(cp, r, m, 0.3).loss - reward_loss(cm, r, m, 0.3).loss) / (2 * h),
                1e-7);
    EXPECT_NEAR(res.drejected[i],
                (reward_loss(c, rp, m, 0.3).loss - reward_loss(c, rm, m, 0.3).loss) / (2 * h),
                1e-7);
  }
  // By hand: softplus(-(0.3-0.1-0.5)) = log(1+e^0.3); center term 0.3 * (0.16+0.49+1+0)/4.
  double want = std::log1p(std::exp(0.3)) + std::log1p(std::exp(1.45)) +
                std::log1p(std::exp(-4.0)) + std::log(2.0);
  want = want / 4 + 0.3 * (0.16 + 0.49 + 1.0) / 4;
  EXPECT_NEAR(res.loss, want, 1e-12);
  EXPECT_DOUBLE_EQ(res.metrics["accuracy"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(res.metrics["min_reward"].get<double>(), -3.0);
  EXPECT_DOUBLE_EQ(res.metrics["max_reward"].get<double>(), 2.0);
}

// The pairs RewardTrainer._prepare_dataset builds from text rows (both tokenizers; explicit and
// implicit prompts, conversational rows, eos already present, margins, max_length's filter).
TEST(RewardData, TokenizedAsRewardTrainerDoes) {
  int checked = 0;
  for (const auto& d : meta()["data"]) {
    const std::string tname = d["tokenizer"];
    auto tok = Tokenizer::load(testing::fixture_path("tokenizers/" + tname));
    auto enc = make_text_encoder(std::shared_ptr<const Tokenizer>(std::move(tok)));
    EXPECT_EQ(enc->pad_token_id(), d["pad_token_id"].get<int32_t>()) << tname;
    const std::string path = testing::temp_dir("reward_data") + "/d.jsonl";
    std::string text;
    for (const auto& row : d["rows"]) text += row.dump() + "\n";
    write_text_atomic(path, text);
    DataConfig dc;
    dc.max_length = d["max_length"].is_null() ? 0 : d["max_length"].get<int64_t>();
    const RewardData data = load_reward_data(path, *enc, dc);
    const auto& kept = d["kept"];
    ASSERT_EQ(data.pairs.size(), kept.size()) << tname << " " << d["kind"];
    for (size_t i = 0; i < kept.size(); ++i) {
      EXPECT_EQ(data.pairs[i].chosen_ids, kept[i]["chosen_ids"].get<std::vector<int32_t>>())
          << tname << " " << d["kind"] << " row " << i;
      EXPECT_EQ(data.pairs[i].rejected_ids, kept[i]["rejected_ids"].get<std::vector<int32_t>>())
          << tname << " " << d["kind"] << " row " << i;
      if (kept[i].contains("margin")) {
        EXPECT_EQ(data.pairs[i].margin, kept[i]["margin"].get<double>());
      }
      ++checked;
    }
    EXPECT_EQ(data.stats.too_long_examples, static_cast<int64_t>(d["rows"].size() - kept.size()));
    if (data.stats.too_long_examples > 0) {
      EXPECT_NE(data.stats.summary().find("1 dropped longer than max_length"), std::string::npos)
          << data.stats.summary();
    }
  }
  EXPECT_GE(checked, 12);
}

// A causal LM turned into a classifier (fresh score from the seed), saved and loaded again:
// an HF folder transformers reads as Qwen2ForSequenceClassification without an LM head.
std::shared_ptr<DecoderModel> converted_qwen2() {
  SequenceClassifierLoad rep;
  auto m = load_sequence_classifier(testing::fixture_path("models/qwen2_tied/model"), Device::cpu(),
                                    DType::kF32, 7, 1, &rep);
  EXPECT_TRUE(rep.converted_from_causal_lm);
  m->set_pad_token_id(0);
  return m;
}

TEST(RewardModelFolder, RoundTripAndWhatTransformersReads) {
  auto m = converted_qwen2();
  const std::string dir = testing::temp_dir("reward_folder") + "/ours_qwen2";
  m->save(dir, DType::kF32);
  if (const char* x = std::getenv("LEANTUNE_REWARD_EXPORT_DIR"))
    m->save(std::string(x) + "/ours_qwen2", DType::kF32);
  const nlohmann::json cfg = nlohmann::json::parse(read_text_file(dir + "/config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"Qwen2ForSequenceClassification"}));
  EXPECT_EQ(cfg["id2label"], nlohmann::json({{"0", "LABEL_0"}}));
  EXPECT_EQ(cfg["pad_token_id"], 0);
  const TensorStore st = TensorStore::open(dir);
  EXPECT_TRUE(st.contains("score.weight"));
  EXPECT_FALSE(st.contains("lm_head.weight"));
  SequenceClassifierLoad rep;
  auto back = load_sequence_classifier(dir, Device::cpu(), DType::kF32, 99, 1, &rep);
  EXPECT_FALSE(rep.converted_from_causal_lm);
  const Batch b = sequences_batch(sequences(), 0, true, 0);
  const std::vector<double> ours = scores_of(*m, b);
  EXPECT_EQ(scores_of(*back, b), ours);
  const RewardModel rm = open_reward_model(dir, Device::cpu(), DType::kF32);
  EXPECT_EQ(rm.score(b), ours);
  // transformers' AutoModelForSequenceClassification on the same folder (recorded by
  // gen_reward_fixtures.py --ours).
  ASSERT_TRUE(meta().contains("ours") && meta()["ours"].contains("ours_qwen2"));
  const auto& hf = meta()["ours"]["ours_qwen2"];
  EXPECT_EQ(hf["architectures"], nlohmann::json::array({"Qwen2ForSequenceClassification"}));
  EXPECT_EQ(hf["num_labels"], 1);
  expect_scores(ours, hf["scores"].get<std::vector<double>>(), "transformers on our folder");
  // A classifier folder with another num_labels is refused for reward modelling.
  EXPECT_THROW(load_sequence_classifier(dir, Device::cpu(), DType::kF32, 0, 2), Error);
}

TEST(RewardModelFolder, LoraAdapterWithScoreInModulesToSaveAsPeftReadsIt) {
  auto m = converted_qwen2();
  PeftConfig pc;
  pc.r = 4;
  pc.lora_alpha = 8;
  pc.lora_dropout = 0;
  pc.task_type = "SEQ_CLS";
  pc.modules_to_save = {"score"};
  PeftSetup peft = apply_peft(pc, *m, 7);
  // Non-zero LoRA B and a changed score, so that the adapter matters.
  {
    NoGradGuard ng;
    Generator gen(11, RngPurpose::kInit);
    for (auto& [name, t] : peft.trainable_parameters(*m))
      if (name.find("lora_B") != std::string::npos || name.find("score") != std::string::npos)
        normal_(t, gen, 0.0, 0.2);
  }
  const std::vector<std::string> keys = [&] {
    std::vector<std::string> k;
    for (const auto& [name, t] : peft.trainable_parameters(*m)) k.push_back(name);
    return k;
  }();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "base_model.model.score.weight"), keys.end());
  peft.set_training(false);
  const Batch b = sequences_batch(sequences(), 0, true, 0);
  const std::vector<double> ours = scores_of(*m, b);
  const std::string root = testing::temp_dir("reward_lora");
  fs::create_directories(root + "/base");
  fs::copy(testing::fixture_path("models/qwen2_tied/model"), root + "/base",
           fs::copy_options::recursive);
  save_peft(peft, *m, root + "/ours_qwen2_lora", "base");
  if (const char* x = std::getenv("LEANTUNE_REWARD_EXPORT_DIR"))
    save_peft(peft, *m, std::string(x) + "/ours_qwen2_lora",
              "tests/fixtures/models/qwen2_tied/model");
  const nlohmann::json ac =
      nlohmann::json::parse(read_text_file(root + "/ours_qwen2_lora/adapter_config.json"));
  EXPECT_EQ(ac["task_type"], "SEQ_CLS");
  EXPECT_EQ(ac["modules_to_save"], nlohmann::json::array({"score"}));
  // Loaded again (the base converted, its score replaced by the adapter's): the same scores.
  const RewardModel rm =
      open_reward_model(root + "/ours_qwen2_lora", Device::cpu(), DType::kF32, 0);
  expect_scores(rm.score(b), ours, "adapter round trip");
  // PEFT's AutoPeftModelForSequenceClassification on the adapter (gen_reward_fixtures.py
  // --ours-adapter), base the tiny Qwen2 causal LM.
  ASSERT_TRUE(meta().contains("ours") && meta()["ours"].contains("ours_qwen2_lora"));
  expect_scores(ours, meta()["ours"]["ours_qwen2_lora"]["scores"].get<std::vector<double>>(),
                "PEFT on our adapter");
}

TEST(RewardTrainer, DemoLearnsToRankAndScoreWritesRewards) {
  const std::string out = testing::temp_dir("reward_demo");
  std::string log;
  ASSERT_EQ(
      run_command("cd " + out + " && " + trainer_bin() + " reward --device cpu --max_steps 20 2>&1",
                  &log),
      0)
      << log;
  const std::string dir = out + "/trainer_output/embedded_reward";
  std::ifstream f(dir + "/metrics.jsonl");
  nlohmann::json first, last;
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("accuracy")) continue;
    if (first.is_null()) first = j;
    last = j;
  }
  ASSERT_FALSE(last.is_null()) << log;
  EXPECT_GT(last["accuracy"].get<double>(), 0.9) << log;
  EXPECT_GT(last["margin"].get<double>(), 1.0);
  EXPECT_LT(last["loss"].get<double>(), first["loss"].get<double>());
  for (const char* k : {"min_reward", "mean_reward", "max_reward"})
    EXPECT_TRUE(last.contains(k)) << k;
  // trainer_bin score on the demo's pairs: every chosen above its rejected, one line per row.
  const std::string data = std::string(LT_SOURCE_DIR) + "/data/embedded/preferences.jsonl";
  ASSERT_EQ(run_command(trainer_bin() + " score --device cpu --model " + dir + " --dataset " +
                            data + " --output " + out + "/r.jsonl 2>&1",
                        &log),
            0)
      << log;
  std::ifstream r(out + "/r.jsonl");
  int64_t rows = 0, ranked = 0;
  while (std::getline(r, line)) {
    const auto j = nlohmann::json::parse(line);
    ++rows;
    ranked += j["chosen_reward"].get<double>() > j["rejected_reward"].get<double>();
    EXPECT_EQ(j["line"].get<int64_t>(), rows);
  }
  EXPECT_EQ(rows, 64);
  EXPECT_GE(ranked, 60);
}

TEST(RewardTrainer, LoraTrainsTheScoreHeadAndTheAdapterScores) {
  const std::string out = testing::temp_dir("reward_lora_demo");
  std::string log;
  ASSERT_EQ(run_command("cd " + out + " && " + trainer_bin() +
                            " reward --device cpu --max_steps 10 --use_peft --lora_r 4 "
                            "--learning_rate 3e-3 --per_device_train_batch_size 4 "
                            "--gradient_accumulation_steps 2 2>&1",
                        &log),
            0)
      << log;
  const std::string dir = out + "/trainer_output/embedded_reward";
  const nlohmann::json ac = nlohmann::json::parse(read_text_file(dir + "/adapter_config.json"));
  EXPECT_EQ(ac["task_type"], "SEQ_CLS");
  EXPECT_EQ(ac["modules_to_save"], nlohmann::json::array({"score"}));
  const TensorStore st = TensorStore::open(dir + "/adapter_model.safetensors");
  EXPECT_TRUE(st.contains("base_model.model.score.weight"));
  ASSERT_EQ(
      run_command("cd " + out + " && " + trainer_bin() + " score --device cpu --model " + dir +
                      " --dataset " + LT_SOURCE_DIR + "/data/embedded/preferences.jsonl 2>&1",
                  &log),
      0)
      << log;
  EXPECT_NE(log.find("\"chosen_reward\""), std::string::npos) << log;
}

TEST(RewardTrainer, AccumulationTwoByTwoEqualsFourByOne) {
  const std::string out = testing::temp_dir("reward_accum");
  auto run = [&](const std::string& name, const std::string& flags) {
    std::string log;
    EXPECT_EQ(run_command("cd " + out + " && " + trainer_bin() +
                              " reward --device cpu --max_steps 2 --logging_steps 1 "
                              "--output_dir " +
                              name + " " + flags + " 2>&1",
                          &log),
              0)
        << log;
    return testing::read_losses(out + "/" + name + "/metrics.jsonl");
  };
  const auto a = run("a", "--per_device_train_batch_size 4");
  const auto b = run("b",
                     "--per_device_train_batch_size 2 --gradient_accumulation_steps 2 "
                     "--padding_free true");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i].second, b[i].second, 1e-5);
}

}  // namespace
}  // namespace leantune

namespace leantune {
namespace {

// estimate reward: the policy step over chosen + rejected with the score head, nothing of
// vocabulary size held by the loss; the trained head counted under LoRA.
TEST(RewardEstimate, ScoreHeadInsteadOfTheLmHead) {
  Options o = reward_options("estimate reward");
  o.parse({"--per_device_train_batch_size", "3", "--max_length", "40", "--gradient_checkpointing",
           "false"});
  const ModelConfig causal = ModelConfig::load(testing::fixture_path("models/llama_gqa/model"));
  const EstimateConfig c = reward_estimate_config(o, causal, true);
  EXPECT_TRUE(c.model.sequence_classification);
  EXPECT_EQ(c.micro_batch_tokens, 2 * 3 * 40);
  const MemoryEstimate e = estimate_memory(c);
  const int64_t h = causal.hidden_size;
  EXPECT_EQ(e.loss, 240 * h * 4 + h * 4);  // the final hidden rows' gradient + the head's
  EXPECT_EQ(e.total_parameters, c.model.num_parameters());
  EXPECT_EQ(e.total_parameters, causal.num_parameters() - causal.vocab_size * h + h);
  Options lo = reward_options("estimate reward");
  lo.parse({"--use_peft", "--lora_r", "4"});
  const MemoryEstimate el = estimate_memory(reward_estimate_config(lo, causal, true));
  // LoRA on q_proj and v_proj of both layers, plus the score head trained whole.
  const int64_t q = causal.num_attention_heads * causal.head_dim;
  const int64_t kv = causal.num_key_value_heads * causal.head_dim;
  EXPECT_EQ(el.trainable_parameters, 2 * 4 * ((h + q) + (h + kv)) + h);
}

}  // namespace
}  // namespace leantune
