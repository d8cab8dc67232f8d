// trainer_bin kto: the trainer's batches (KL rotation, collation) give TRL's loss on the fixture
// batch; the built-in demo learns to prefer the desirable completions; bad options refused.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "loaders/fs_util.h"
#include "testing/testing.h"
#include "trainers/kto/kto.h"
#include "trainers/trainer_test_util.h"

namespace leantune {
namespace {

using testing::run_command;
using testing::trainer_bin;

double rel(double a, double e) { return std::abs(a - e) / std::max(std::abs(e), 1e-12); }

// The fixture's four examples through KtoTrainer (its collation, KL rotation, reference forward
// and loss) equal TRL's KTOTrainer.compute_loss on the same batch.
TEST(Kto, TrainerBatchLossMatchesTrl) {
  const nlohmann::json meta =
      nlohmann::json::parse(read_text_file(testing::fixture_path("kto/cases.json")));
  for (const char* name : {"kto", "kto_swapped", "apo_zero_unpaired_swapped"}) {
    nlohmann::json c;
    for (const auto& x : meta["cases"])
      if (x["name"] == name) c = x;
    ASSERT_FALSE(c.is_null()) << name;
    const bool swap = c.value("swap", false);
    const std::string a = testing::fixture_path("models/qwen2_tied/model");
    const std::string b = testing::fixture_path("dpo/ref_model");
    auto model =
        std::shared_ptr<DecoderModel>(DecoderModel::load(swap ? b : a, Device::cpu(), DType::kF32));
    model->set_requires_grad(true);
    UnpairedData data;
    int64_t line = 1;
    for (const auto& e : meta["examples"]) {
      UnpairedExample ex;
      ex.prompt_ids = e["prompt_ids"].get<std::vector<int32_t>>();
      ex.completion_ids = e["completion_ids"].get<std::vector<int32_t>>();
      ex.label = e["label"].get<bool>();
      ex.line = line++;
      data.examples.push_back(ex);
    }
    Options o = kto_options();
    o.parse({"--output_dir", testing::temp_dir("kto_fixture"), "--device", "cpu",
             "--per_device_train_batch_size", "4"});
    KtoLossConfig lc;
    lc.loss_type = c["loss_type"].get<std::string>();
    SequenceLogpsOptions lo;
    lo.chunk_tokens = 7;
    KtoTrainer t(training_arguments(o), model, o, "", data, 0, "keep_start", lc, lo);
    t.set_peft(PeftSetup{}, "", false);
    RefModelConfig rc;
    rc.ref_model = swap ? a : b;
    t.set_reference(rc);
    const UnpairedBatch ub =
        collate_unpaired(data.examples, {0, 1, 2, 3}, 0, "keep_start", kto_uses_kl(lc));
    KtoLossResult r;
    Tensor loss = t.batch_loss(ub, 1.0, &r);
    EXPECT_LE(rel(loss.item(), c["loss"].get<double>()), 1e-5) << name;
    EXPECT_LE(std::abs(r.kl - c["metrics"]["kl"].get<double>()), 1e-5) << name;
  }
}

TEST(Kto, DemoLearnsToPreferTheDesirableCompletions) {
  const std::string out = testing::temp_dir("kto_demo");
  std::string log;
  ASSERT_EQ(
      run_command("cd " + out + " && " + trainer_bin() + " kto --device cpu --max_steps 20 2>&1",
                  &log),
      0)
      << log;
  std::ifstream f(out + "/trainer_output/embedded_kto/metrics.jsonl");
  nlohmann::json first, last;
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("rewards/margins")) continue;
    if (first.is_null()) first = j;
    last = j;
  }
  ASSERT_FALSE(last.is_null()) << log;
  EXPECT_GT(last["rewards/margins"].get<double>(), 1.0) << log;
  EXPECT_GT(last["rewards/chosen"].get<double>(), last["rewards/rejected"].get<double>());
  EXPECT_LT(last["loss"].get<double>(), first["loss"].get<double>());
  EXPECT_TRUE(last.contains("kl") && last.contains("logps/chosen") &&
              last.contains("logits/rejected"))
      << last.dump();
}

TEST(Kto, BadOptionsAreOneLineExitTwo) {
  const std::string out = testing::temp_dir("kto_bad");
  std::string log;
  EXPECT_EQ(run_command(trainer_bin() + " kto --device cpu --per_device_train_batch_size 1 " +
                            "--output_dir " + out + "/a 2>&1",
                        &log),
            2)
      << log;
  EXPECT_NE(log.find("option per_device_train_batch_size 1"), std::string::npos) << log;
  EXPECT_EQ(run_command(trainer_bin() + " kto --device cpu --loss_type sigmoid --output_dir " +
                            out + "/b 2>&1",
                        &log),
            2)
      << log;
  EXPECT_NE(log.find("loss_type"), std::string::npos) << log;
}

// QLoRA with sequence tiling: the memory report names the 4-bit base, the adapter's savings,
// the tiling and the streaming load, as sft's and dpo's do (the shared part of the report).
TEST(Kto, QloraReportsTheQuantizedBaseTheAdapterAndTheTiling) {
  const std::string out = testing::temp_dir("kto_qlora");
  std::string log;
  ASSERT_EQ(run_command(trainer_bin() + " kto --device cpu --max_steps 2 --use_peft " +
                            "--load_in_4bit --tiled_mlp true --tiled_mlp_chunk_size 16 " +
                            "--output_dir " + out + "/o 2>&1",
                        &log),
            0)
      << log;
  EXPECT_NE(log.find("quantized base (nf4)"), std::string::npos) << log;
  EXPECT_NE(log.find("    LoRA: "), std::string::npos) << log;
  EXPECT_NE(log.find("sequence tiling: decoder layers in blocks of 16 tokens"), std::string::npos)
      << log;
  EXPECT_NE(log.find("streaming weight loading"), std::string::npos) << log;
}

// estimate kto: the policy step over the matched sequences only (the KL ones run without
// gradient), so a kto micro-batch of 2B examples costs what a dpo micro-batch of B pairs does.
TEST(Kto, EstimateCountsTheMatchedSequences) {
  std::string kto, dpo;
  ASSERT_EQ(run_command(trainer_bin() + " estimate kto --per_device_train_batch_size 4 " +
                            "--max_length 64 --use_peft 2>&1",
                        &kto),
            0)
      << kto;
  ASSERT_EQ(run_command(trainer_bin() + " estimate dpo --per_device_train_batch_size 2 " +
                            "--max_length 64 --use_peft 2>&1",
                        &dpo),
            0)
      << dpo;
  auto line = [](const std::string& out, const std::string& key) {
    const size_t at = out.find("\n  " + key);
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at + 1) - at);
  };
  EXPECT_NE(kto.find("256 tokens per micro-batch"), std::string::npos) << kto;
  EXPECT_FALSE(line(kto, "activations").empty()) << kto;
  EXPECT_EQ(line(kto, "activations"), line(dpo, "activations"));
  EXPECT_EQ(line(kto, "peak"), line(dpo, "peak"));
}

}  // namespace
}  // namespace leantune
