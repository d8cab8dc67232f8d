// What an HPC pipeline needs from the public API besides training (include/leantune/leantune.h):
// a log sink with a minimum level instead of stderr, and running without leantune's signal
// handlers while still stopping a run from the embedder's own (request_stop). Only the public
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
