// The public API runs every algorithm whose model Model::load loads (TrainerSetup::algorithm):
// each run's per-update losses equal, bit for bit, those `trainer_bin <algorithm>` writes to
// metrics.jsonl for the same options (the same TrainerSpec behind both); rows in memory train as
// the same rows in a file; the algorithm it cannot run and unknown names are one-line input
// errors.
#include <gtest/gtest.h>
#include <leantune/leantune.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "testing/testing.h"

namespace lt = leantune::api;

namespace {

// metrics.jsonl's per-update loss and gradient norm, in train_trace's layout.
std::vector<double> metrics_trace(const std::string& dir) {
  std::vector<double> trace;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("grad_norm") && !j.contains("train_runtime")) {
      trace.push_back(j.at("loss").get<double>());
      trace.push_back(j.at("grad_norm").get<double>());
    }
  }
  return trace;
}

// Per update: the loss and the gradient norm (GRPO's loss is 0 on its first, on-policy updates:
// the group-normalised advantages sum to zero; its gradient is not).
std::vector<double> train_trace(const std::string& algorithm, const std::string& config,
                                const std::optional<std::vector<std::string>>& rows) {
  lt::Model model = lt::Model::load("", {});
  lt::TrainerSetup setup;
  setup.algorithm = algorithm;
  setup.install_signal_handlers = false;
  setup.dataset_rows = rows;
  lt::Trainer t(model, config, setup);
  std::vector<double> trace;
  t.train([&](const lt::StepMetrics& m) {
    trace.push_back(m.loss);
    trace.push_back(m.grad_norm);
    return true;
  });
  return trace;
}

class ApiAlgorithm : public ::testing::TestWithParam<std::string> {};

// distill's teacher: a fresh initialisation of the demo model's shape (the student is the demo
// model, loaded by Model::load("") and by the command alike).
std::string distill_teacher() {
  const std::string dir = leantune::testing::temp_dir("api_distill_teacher");
  const std::string src = LT_SOURCE_DIR;
  const std::string cmd = std::string(LT_BINARY_DIR) + "/trainer_bin init-model --config " + src +
                          "/data/embedded/config.json --tokenizer " + src +
                          "/data/embedded --seed 5 --out " + dir + " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

// Three updates: the online demos' first two have equal rewards in every group, so no gradient.
TEST_P(ApiAlgorithm, LossesEqualTheCommandsOnTheDemo) {
  const std::string algorithm = GetParam();
  const std::string api_out = leantune::testing::temp_dir("api_" + algorithm);
  const std::string cli_out = leantune::testing::temp_dir("cli_" + algorithm);
  const std::string teacher = algorithm == "distill" ? distill_teacher() : "";
  const std::string extra_json =
      teacher.empty() ? "" : R"(, "teacher_model_name_or_path": ")" + teacher + R"(")";
  const std::vector<double> api =
      train_trace(algorithm,
                  R"({"max_steps": 3, "logging_steps": 1, "output_dir": ")" + api_out + R"(")" +
                      extra_json + "}",
                  std::nullopt);
  ASSERT_EQ(api.size(), 6u);
  const std::string cmd = std::string(LT_BINARY_DIR) + "/trainer_bin " + algorithm +
                          " --max_steps 3 --logging_steps 1 --output_dir " + cli_out +
                          (teacher.empty() ? "" : " --teacher_model_name_or_path " + teacher) +
                          " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(api, metrics_trace(cli_out)) << algorithm;
  double grad = 0;
  for (size_t i = 0; i < api.size(); ++i) {
    EXPECT_TRUE(std::isfinite(api[i]));
    if (i % 2 == 1) grad += api[i];
  }
  EXPECT_GT(grad, 0.0) << "no gradient: the comparison would be empty";
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ApiAlgorithm,
                         ::testing::Values("dpo", "kto", "grpo", "rloo", "online_dpo", "distill"),
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

TEST(ApiAlgorithm, UnknownAndRewardAreOneLineInputErrors) {
  std::string msg;
  lt::TrainerSetup s;
  s.algorithm = "ppo";
  EXPECT_EQ(setup_error(s, &msg), lt::ErrorCategory::kInput);
  EXPECT_NE(msg.find("TrainerSetup::algorithm 'ppo'"), std::string::npos) << msg;
  s.algorithm = "reward";
  EXPECT_EQ(setup_error(s, &msg), lt::ErrorCategory::kInput);
  EXPECT_NE(msg.find("trainer_bin reward"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

// Rows in memory train exactly as the same rows in a file, for the preference and online
// algorithms too; a bad row is named dataset_rows:N.
class ApiRows : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> rows_for(const std::string& algorithm) {
  std::vector<std::string> rows;
  for (int i = 0; i < 12; ++i) {
    const std::string a = std::to_string(i % 10), b = std::to_string((i * 7) % 10);
    if (algorithm == "kto")
      rows.push_back(R"({"prompt": "Tell me about )" + a + R"(.", "completion": " It is )" + b +
                     R"(.", "label": )" + (i % 2 ? "true" : "false") + "}");
    else if (algorithm == "dpo")
      rows.push_back(R"({"prompt": "Tell me about )" + a + R"(.", "chosen": " It is )" + a +
                     R"(.", "rejected": " No )" + b + R"(."})");
    else
      rows.push_back(R"({"prompt": "Add )" + a + " and " + b + R"(.", "answer": ")" +
                     std::to_string(i % 10 + (i * 7) % 10) + R"("})");
  }
  return rows;
}

TEST_P(ApiRows, RowsInMemoryTrainAsTheSameFile) {
  const std::string algorithm = GetParam();
  const std::vector<std::string> rows = rows_for(algorithm);
  const std::string dir = leantune::testing::temp_dir("api_rows_" + algorithm);
  const std::string file = dir + "/rows.jsonl";
  {
    std::ofstream out(file);
    for (const std::string& r : rows) out << r << "\n";
  }
  std::string extra = R"(, "max_steps": 2, "per_device_train_batch_size": 4, "max_length": 64)";
  if (algorithm == "grpo")
    extra = R"(, "max_steps": 2, "per_device_train_batch_size": 16, "num_generations": 8, )"
            R"("max_completion_length": 4, "format_pattern": "^ *[a-m]", )"
            R"("reward_funcs": ["format_reward", "accuracy_reward"])";
  const std::vector<double> from_rows =
      train_trace(algorithm, R"({"output_dir": ")" + dir + R"(/a")" + extra + "}", rows);
  const std::vector<double> from_file = train_trace(
      algorithm, R"({"output_dir": ")" + dir + R"(/b", "dataset": ")" + file + "\"" + extra + "}",
      std::nullopt);
  ASSERT_EQ(from_rows.size(), 4u);
  EXPECT_EQ(from_rows, from_file);
  for (double v : from_rows) EXPECT_TRUE(std::isfinite(v));
  EXPECT_GT(from_rows[1] + from_rows[3], 0.0) << "no gradient: the comparison would be empty";

  std::vector<std::string> bad = rows;
  bad[4] = R"({"prompt": 3})";
  lt::Model model = lt::Model::load("", {});
  lt::TrainerSetup setup;
  setup.algorithm = algorithm;
  setup.dataset_rows = bad;
  try {
    lt::Trainer t(model, R"({"output_dir": ")" + dir + R"(/c")" + extra + "}", setup);
    ADD_FAILURE() << "a bad row was accepted";
  } catch (const lt::Error& e) {
    EXPECT_EQ(e.category(), lt::ErrorCategory::kInput);
    EXPECT_NE(std::string(e.what()).find("dataset_rows:5"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ApiRows, ::testing::Values("dpo", "kto", "grpo"),
                         [](const auto& info) { return info.param; });

}  // namespace
