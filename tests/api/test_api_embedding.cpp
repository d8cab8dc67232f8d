// What an HPC pipeline needs from the public API besides training (include/leantune/leantune.h):
// a log sink with a minimum level instead of stderr, training rows given in memory (equal to the
// same rows in a file, bad rows named by index), and running without leantune's signal handlers
// while still stopping a run from the embedder's own (request_stop). Only the public
// header is included, as in a pipeline. (The MPI communicator is tested under mpirun:
// api_mpi_main.cpp.)
#include <gtest/gtest.h>
#include <leantune/leantune.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "testing/testing.h"

namespace lt = leantune::api;

namespace {

std::string quick_config(const std::string& out, int steps, const std::string& extra = "") {
  return R"({"max_steps": )" + std::to_string(steps) + R"(, "output_dir": ")" + out +
         R"(", "max_length": 64, "per_device_train_batch_size": 2)" + extra + "}";
}

struct Collected {
  std::vector<std::pair<lt::LogLevel, std::string>> lines;
  int count(lt::LogLevel level, const std::string& fragment) const {
    int n = 0;
    for (const auto& [l, text] : lines) n += l == level && text.find(fragment) != std::string::npos;
    return n;
  }
};

// Restores stderr as the destination however a test ends.
struct SinkGuard {
  ~SinkGuard() { lt::set_log_sink({}); }
};

TEST(ApiEmbedding, LogSinkGetsTheTrainingLinesNotStderr) {
  const std::string dir = leantune::testing::temp_dir("api_log_sink");
  SinkGuard guard;
  Collected got;
  lt::set_log_sink([&](lt::LogLevel l, const std::string& s) { got.lines.emplace_back(l, s); },
                   lt::LogLevel::kDebug);
  lt::Model m = lt::Model::load("");
  ::testing::internal::CaptureStderr();
  lt::TrainSummary s = lt::Trainer(m, quick_config(dir, 3, R"(, "logging_steps": 1)")).train();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(s.steps, 3);
  for (int step = 1; step <= 3; ++step)
    EXPECT_EQ(got.count(lt::LogLevel::kInfo, "step " + std::to_string(step) + "/3  loss "), 1)
        << "step " << step;
  for (const auto& [l, text] : got.lines) EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  EXPECT_EQ(got.count(lt::LogLevel::kInfo, "tokens kept"), 1);  // the data summary
  EXPECT_EQ(err, "");  // nothing of the training reached stderr
}

TEST(ApiEmbedding, LogLevelFiltersMessages) {
  const std::string dir = leantune::testing::temp_dir("api_log_level");
  // Four rows, two micro-batches an epoch: gradient_accumulation_steps 8 is cut to the epoch's,
  // with a warning.
  const std::string data = dir + "/rows.jsonl";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(data);
    for (const char* t : {"One day a cat sat.", "The sun was warm.", "Mia ran home.", "It rained."})
      f << R"({"text": ")" << t << "\"}\n";
  }
  const std::string cfg = quick_config(
      dir + "/out", 2,
      R"(, "logging_steps": 1, "gradient_accumulation_steps": 8, "dataset": ")" + data + "\"");
  SinkGuard guard;
  lt::Model m = lt::Model::load("");
  Collected all, warnings;
  lt::set_log_sink([&](lt::LogLevel l, const std::string& s) { all.lines.emplace_back(l, s); });
  lt::Trainer(m, cfg).train();
  EXPECT_EQ(all.count(lt::LogLevel::kWarning, "gradient_accumulation_steps 8"), 1);
  EXPECT_EQ(all.count(lt::LogLevel::kInfo, "step 2/2  loss "), 1);
  std::filesystem::remove_all(dir + "/out");
  lt::set_log_sink([&](lt::LogLevel l, const std::string& s) { warnings.lines.emplace_back(l, s); },
                   lt::LogLevel::kWarning);
  lt::Trainer(m, cfg).train();
  EXPECT_EQ(warnings.count(lt::LogLevel::kWarning, "gradient_accumulation_steps 8"), 1);
  EXPECT_EQ(warnings.lines.size(), 1u);  // no progress line below the level
}

// Rows given in memory train exactly as the same rows in a JSONL file.
std::vector<double> losses_of(lt::Model& m, const std::string& cfg, const lt::TrainerSetup& setup) {
  return lt::Trainer(m, cfg, setup).train().losses;
}

TEST(ApiEmbedding, RowsInMemoryTrainAsTheSameFile) {
  const std::string dir = leantune::testing::temp_dir("api_rows");
  std::filesystem::create_directories(dir);
  const std::vector<std::vector<std::string>> datasets = {
      {R"({"text": "One day a cat sat on the mat."})",
       R"({"text": "The sun was warm and bright."})", "", R"({"text": "Mia ran home to her mom."})",
       R"({"text": "It rained all day long."})"},
      {R"({"input_ids": [5, 17, 42, 9, 3, 88], "completion_mask": [0, 0, 1, 1, 1, 1]})",
       R"({"input_ids": [7, 7, 12, 30], "completion_mask": [0, 1, 1, 1]})",
       R"({"input_ids": [11, 2, 19, 64, 21], "completion_mask": [1, 1, 1, 1, 1]})"}};
  for (size_t d = 0; d < datasets.size(); ++d) {
    const std::string file = dir + "/rows" + std::to_string(d) + ".jsonl";
    {
      std::ofstream f(file);
      for (const std::string& row : datasets[d]) f << row << "\n";
    }
    const std::string cfg = R"(, "logging_steps": 100, "seed": 3)";
    lt::Model a = lt::Model::load("");
    const std::vector<double> from_file = losses_of(
        a,
        quick_config(dir + "/file" + std::to_string(d), 3, cfg + R"(, "dataset": ")" + file + "\""),
        {});
    lt::Model b = lt::Model::load("");
    lt::TrainerSetup setup;
    setup.dataset_rows = datasets[d];
    const std::vector<double> from_rows =
        losses_of(b, quick_config(dir + "/rows" + std::to_string(d), 3, cfg), setup);
    ASSERT_EQ(from_file.size(), 3u) << "dataset " << d;
    EXPECT_EQ(from_rows, from_file) << "dataset " << d;
  }
}

TEST(ApiEmbedding, BadRowsInMemoryAreNamedByIndex) {
  const std::string dir = leantune::testing::temp_dir("api_bad_rows");
  lt::Model m = lt::Model::load("");
  lt::TrainerSetup setup;
  setup.dataset_rows = {R"({"text": "fine"})", R"({"text": "fine too"})", R"({"txt": "no"})"};
  try {
    lt::Trainer(m, quick_config(dir, 2), setup);
    ADD_FAILURE() << "a bad row was accepted";
  } catch (const lt::Error& e) {
    EXPECT_EQ(e.category(), lt::ErrorCategory::kInput);
    EXPECT_NE(std::string(e.what()).find("dataset_rows:3: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'text'"), std::string::npos) << e.what();
  }
  setup.dataset_rows = {R"({"text": "fine"})", "{not json"};
  try {
    lt::Trainer(m, quick_config(dir, 2), setup);
    ADD_FAILURE() << "a row that is not JSON was accepted";
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset_rows:2: "), std::string::npos) << e.what();
  }
  // Rows and a dataset file at once: one of them must go.
  setup.dataset_rows = {R"({"text": "fine"})"};
  try {
    lt::Trainer(m, quick_config(dir, 2, R"(, "dataset": "x.jsonl")"), setup);
    ADD_FAILURE() << "rows and a dataset file were both accepted";
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("option dataset x.jsonl"), std::string::npos) << e.what();
  }
}

void embedder_on_term(int) { lt::request_stop(); }

// The handler SIGTERM has now.
void (*current_term_handler())(int) {
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  return now.sa_handler;
}

TEST(ApiEmbedding, WithoutSignalHandlersTheEmbeddersStaysAndRequestStopStops) {
  const std::string dir = leantune::testing::temp_dir("api_no_signals");
  struct sigaction mine {
  }, old{};
  mine.sa_handler = embedder_on_term;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGTERM, &mine, &old), 0);
  lt::Model m = lt::Model::load("");
  // By default train() installs its own handler while it runs.
  std::vector<bool> embedders_during;
  lt::Trainer(m, quick_config(dir + "/default", 1)).train([&](const lt::StepMetrics&) {
    embedders_during.push_back(current_term_handler() == embedder_on_term);
    return true;
  });
  EXPECT_EQ(embedders_during, (std::vector<bool>{false}));
  EXPECT_EQ(current_term_handler(), embedder_on_term);  // and restores it after
  // Opted out: the embedder's handler stays in place; a SIGTERM reaches it, and its
  // request_stop() stops the run after the update under way, with a checkpoint.
  lt::TrainerSetup setup;
  setup.install_signal_handlers = false;
  lt::request_stop();  // before train(): dropped when train() begins
  lt::Trainer t(m, quick_config(dir + "/opt_out", 5), setup);
  embedders_during.clear();
  lt::TrainSummary s = t.train([&](const lt::StepMetrics& x) {
    embedders_during.push_back(current_term_handler() == embedder_on_term);
    if (x.step == 2) raise(SIGTERM);
    return true;
  });
  sigaction(SIGTERM, &old, nullptr);
  EXPECT_EQ(embedders_during, (std::vector<bool>{true, true}));
  EXPECT_EQ(s.steps, 2);
  EXPECT_TRUE(s.stopped_early);
  EXPECT_TRUE(std::filesystem::exists(dir + "/opt_out/checkpoint-2/trainer_state.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/opt_out/model.safetensors"));
}

}  // namespace
