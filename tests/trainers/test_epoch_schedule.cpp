// The epoch schedule of the training loop against transformers' own Trainer
// (tests/fixtures/gen_trainer_schedule_fixtures.py): for micro-batches per epoch x
// gradient_accumulation_steps x num_train_epochs x max_steps, the number of updates, the
// micro-batches each update takes (an epoch's last update takes what remains, so no update spans
// two epochs; an epoch with fewer micro-batches than the accumulation is one short update) and
// the epoch logged after each update. And warmup_steps as transformers 5 reads it: a number of
// updates (a fraction dropped) from 1 up, a ratio of all updates below 1, warmup_ratio its alias.
// And when checkpoints are written (save_strategy steps, epoch, no; save_only_model's, which no
// run resumes from) and logging_first_step.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "testing/testing.h"
#include "trainer_test_util.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

const nlohmann::json& fixture() {
  static const nlohmann::json j =
      nlohmann::json::parse(read_text_file(testing::fixture_path("trainer/schedule_cases.json")));
  return j;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& c : fixture()["cases"]) names.push_back(c["name"].get<std::string>());
  return names;
}

class EpochSchedule : public ::testing::TestWithParam<std::string> {};

TEST_P(EpochSchedule, UpdatesMatchTransformersTrainer) {
  nlohmann::json c;
  for (const auto& x : fixture()["cases"])
    if (x["name"] == GetParam()) c = x;
  ASSERT_FALSE(c.is_null());
  const int64_t m = c["micro_batches_per_epoch"].get<int64_t>();
  // M rows, one per micro-batch (no packing).
  const std::string dir = testing::temp_dir("schedule_" + GetParam());
  const std::string data = dir + "/rows.jsonl";
  {
    std::ifstream in(testing::small_dataset());
    std::ofstream out(data);
    std::string line;
    for (int64_t i = 0; i < m && std::getline(in, line); ++i) out << line << "\n";
  }
  static const std::string model = testing::make_tiny_model(testing::temp_dir("schedule_model"));
  std::vector<std::string> extra = {"--dataset",
                                    data,
                                    "--per_device_train_batch_size",
                                    "1",
                                    "--gradient_accumulation_steps",
                                    std::to_string(c["gradient_accumulation_steps"].get<int64_t>()),
                                    "--num_train_epochs",
                                    std::to_string(c["num_train_epochs"].get<double>()),
                                    "--max_steps",
                                    std::to_string(c["max_steps"].get<int64_t>())};
  SftRun run = make_sft_run(testing::tiny_sft_options(model, dir + "/out", extra));
  std::vector<int64_t> micro_batches;
  std::vector<double> epochs;
  run.trainer->set_micro_batch_hook([&](int64_t update, size_t) {
    if (static_cast<int64_t>(micro_batches.size()) < update) micro_batches.push_back(0);
    ++micro_batches.back();
  });
  run.trainer->set_step_callback([&](const nlohmann::json& rec) {
    epochs.push_back(rec.at("epoch").get<double>());
    return true;
  });
  const TrainResult r = run.trainer->train();
  const auto& updates = c["updates"];
  ASSERT_EQ(r.steps, static_cast<int64_t>(updates.size()));
  ASSERT_EQ(micro_batches.size(), updates.size());
  ASSERT_EQ(epochs.size(), updates.size());
  for (size_t u = 0; u < updates.size(); ++u) {
    EXPECT_EQ(micro_batches[u], updates[u]["micro_batches"].get<int64_t>()) << "update " << u + 1;
    EXPECT_NEAR(epochs[u], updates[u]["epoch"].get<double>(), 1e-12) << "update " << u + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, EpochSchedule, ::testing::ValuesIn(case_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The learning rate of each of 8 updates (batch 1, learning rate 1e-3, linear schedule).
std::vector<double> learning_rates(const std::vector<std::string>& warmup) {
  static const std::string model = testing::make_tiny_model(testing::temp_dir("warmup_model"));
  std::vector<std::string> extra = {"--max_steps", "8", "--per_device_train_batch_size", "1"};
  extra.insert(extra.end(), warmup.begin(), warmup.end());
  SftRun run = make_sft_run(testing::tiny_sft_options(model, testing::temp_dir("warmup"), extra));
  std::vector<double> lrs;
  run.trainer->set_step_callback([&](const nlohmann::json& rec) {
    lrs.push_back(rec.at("learning_rate").get<double>());
    return true;
  });
  run.trainer->train();
  return lrs;
}

TEST(Warmup, StepsFromOneRatioBelowOneAsTransformers5) {
  // 2 warmup updates: 0, then half the peak, then the linear decay over the other 6.
  const std::vector<double> two = learning_rates({"--warmup_steps", "2"});
  ASSERT_EQ(two.size(), 8u);
  EXPECT_EQ(two[0], 0.0);
  EXPECT_DOUBLE_EQ(two[1], 0.5e-3);
  EXPECT_DOUBLE_EQ(two[2], 1e-3);
  EXPECT_EQ(learning_rates({"--warmup_steps", "0.25"}), two);  // ceil(0.25 x 8)
  EXPECT_EQ(learning_rates({"--warmup_ratio", "0.25"}), two);  // the alias
  EXPECT_EQ(learning_rates({"--warmup_steps", "2.7"}), two);   // int(2.7), as transformers
  EXPECT_NE(learning_rates({"--warmup_steps", "3"}), two);
}

// The checkpoint folders and logged steps of a run of 5 micro-batches per epoch, accumulation 2
// (3 updates an epoch), 2 epochs: 6 updates.
struct Saved {
  std::vector<std::string> checkpoints;
  std::vector<int64_t> logged;
};
Saved run_saving(const std::vector<std::string>& options) {
  static const std::string model = testing::make_tiny_model(testing::temp_dir("save_model"));
  const std::string dir = testing::temp_dir("save_strategy");
  {
    std::ifstream in(testing::small_dataset());
    std::ofstream out(dir + "/rows.jsonl");
    std::string line;
    for (int i = 0; i < 5 && std::getline(in, line); ++i) out << line << "\n";
  }
  std::vector<std::string> extra = {"--dataset",
                                    dir + "/rows.jsonl",
                                    "--per_device_train_batch_size",
                                    "1",
                                    "--gradient_accumulation_steps",
                                    "2",
                                    "--num_train_epochs",
                                    "2",
                                    "--max_steps",
                                    "-1",
                                    "--logging_steps",
                                    "4"};
  extra.insert(extra.end(), options.begin(), options.end());
  SftRun run = make_sft_run(testing::tiny_sft_options(model, dir + "/out", extra));
  run.trainer->train();
  Saved s;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/out"))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0)
      s.checkpoints.push_back(e.path().filename().string());
  std::sort(s.checkpoints.begin(), s.checkpoints.end());
  for (const auto& [step, loss] : testing::read_losses(dir + "/out/metrics.jsonl"))
    s.logged.push_back(step);
  return s;
}

TEST(SaveStrategy, StepsEpochOrNoAndLoggingFirstStep) {
  // steps: every save_steps (not after the last update: the final model is written then).
  EXPECT_EQ(run_saving({"--save_steps", "2"}).checkpoints,
            (std::vector<std::string>{"checkpoint-2", "checkpoint-4"}));
  // epoch: at the end of every epoch but the last (3 updates an epoch).
  const Saved epoch = run_saving({"--save_strategy", "epoch"});
  EXPECT_EQ(epoch.checkpoints, std::vector<std::string>{"checkpoint-3"});
  EXPECT_EQ(epoch.logged, (std::vector<int64_t>{4, 6}));
  const Saved no = run_saving({"--save_strategy", "no", "--logging_first_step"});
  EXPECT_TRUE(no.checkpoints.empty());
  EXPECT_EQ(no.logged, (std::vector<int64_t>{1, 4, 6}));
  // save_steps belongs to save_strategy steps.
  EXPECT_THROW(run_saving({"--save_strategy", "epoch", "--save_steps", "2"}), Error);
}

TEST(SaveStrategy, SaveOnlyModelCheckpointsHoldNoOptimizerAndRefuseAResume) {
  static const std::string model = testing::make_tiny_model(testing::temp_dir("save_model"));
  const std::string out = testing::temp_dir("save_only_model") + "/out";
  SftRun run = make_sft_run(testing::tiny_sft_options(
      model, out, {"--max_steps", "4", "--save_steps", "2", "--save_only_model"}));
  run.trainer->train();
  const std::string ck = out + "/checkpoint-2";
  EXPECT_TRUE(std::filesystem::exists(ck + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(ck + "/optimizer.safetensors"));
  EXPECT_NE(read_text_file(ck + "/leantune_state.json").find("\"save_only_model\": true"),
            std::string::npos);
  SftRun again = make_sft_run(
      testing::tiny_sft_options(model, out, {"--max_steps", "6", "--resume_from_checkpoint", ck}));
  try {
    again.trainer->train();
    ADD_FAILURE() << "resumed from a save_only_model checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("was saved with save_only_model"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace leantune
