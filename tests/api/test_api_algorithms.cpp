// The public API runs every algorithm whose model Model::load loads (TrainerSetup::algorithm):
// each run's per-update losses equal, bit for bit, those `trainer_bin <algorithm>` writes to
// metrics.jsonl for the same options (the same TrainerSpec behind both); the algorithms it cannot
// run, unknown names and in-memory rows outside sft are one-line input errors.
#include <gtest/gtest.h>
#include <leantune/leantune.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/testing.h"

namespace lt = leantune::api;

namespace {

std::vector<double> metrics_losses(const std::string& dir) {
  std::vector<double> losses;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("step") && !j.contains("train_runtime"))
      losses.push_back(j.at("loss").get<double>());
  }
  return losses;
}

class ApiAlgorithm : public ::testing::TestWithParam<std::string> {};

TEST_P(ApiAlgorithm, LossesEqualTheCommandsOnTheDemo) {
  const std::string algorithm = GetParam();
  const std::string api_out = leantune::testing::temp_dir("api_" + algorithm);
  const std::string cli_out = leantune::testing::temp_dir("cli_" + algorithm);
  lt::Model model = lt::Model::load("", {});
  lt::TrainerSetup setup;
  setup.algorithm = algorithm;
  setup.install_signal_handlers = false;
  lt::Trainer trainer(
      model, R"({"max_steps": 2, "logging_steps": 1, "output_dir": ")" + api_out + R"("})",
      setup);
  const lt::TrainSummary s = trainer.train();
  ASSERT_EQ(s.steps, 2);
  ASSERT_EQ(s.losses.size(), 2u);
  const std::string cmd = std::string(LT_BINARY_DIR) + "/trainer_bin " + algorithm +
                          " --max_steps 2 --logging_steps 1 --output_dir " + cli_out +
                          " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<double> cli = metrics_losses(cli_out);
  ASSERT_EQ(cli.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::isfinite(s.losses[i]));
    EXPECT_EQ(s.losses[i], cli[i]) << algorithm << " update " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ApiAlgorithm,
                         ::testing::Values("dpo", "kto", "grpo", "rloo", "online_dpo"),
                         [](const auto& info) { return info.param; });

lt::ErrorCategory setup_error(const lt::TrainerSetup& setup, std::string* message) {
  lt::Model model = lt::Model::load("", {});
  try {
    lt::Trainer t(model, R"({"max_steps": 1})", setup);
  } catch (const lt::Error& e) {
    *message = e.what();
    return e.category();
  }
  ADD_FAILURE() << "no error";
  return lt::ErrorCategory::kInternal;
}

TEST(ApiAlgorithm, UnknownRewardAndRowsOutsideSftAreOneLineInputErrors) {
  std::string msg;
  lt::TrainerSetup s;
  s.algorithm = "ppo";
  EXPECT_EQ(setup_error(s, &msg), lt::ErrorCategory::kInput);
  EXPECT_NE(msg.find("TrainerSetup::algorithm 'ppo'"), std::string::npos) << msg;
  s.algorithm = "reward";
  EXPECT_EQ(setup_error(s, &msg), lt::ErrorCategory::kInput);
  EXPECT_NE(msg.find("trainer_bin reward"), std::string::npos) << msg;
  s.algorithm = "dpo";
  s.dataset_rows = std::vector<std::string>{R"({"prompt": "a", "chosen": "b", "rejected": "c"})"};
  EXPECT_EQ(setup_error(s, &msg), lt::ErrorCategory::kInput);
  EXPECT_NE(msg.find("dataset_rows"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

}  // namespace
