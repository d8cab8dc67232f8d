// trainer_bin generate --batch: every prompt row completed, one JSON line each in file order;
// a greedy batch of several prompts (of different lengths) gives each row the tokens it gets
// alone (batch_size 1) and the tokens of --prompt, and so does a sampled one (a stream per row);
// conversational prompts go through the chat template; bad input is exit 2 in one line naming the
// file and line or the options.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "testing/testing.h"
#include "trainers/trainer_test_util.h"

namespace leantune {
namespace {

using testing::run_command;
using testing::trainer_bin;

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(GenerateBatch, BatchedRowsEqualOneAtATime) {
  const std::string dir = testing::temp_dir("gen");
  const std::string model = testing::make_tiny_model(dir + "/model");
  const std::string prompts = dir + "/p.jsonl";
  // Prompt + completion rows (one schema per file): only the prompts are completed.
  std::ofstream(prompts) << R"({"prompt": "Once upon a time there was", "completion": "x"})"
                         << "\n"
                         << R"({"prompt": "A", "completion": "ignored"})"
                         << "\n"
                         << R"({"prompt": "The little cat", "completion": "ignored"})"
                         << "\n";
  const std::string base = trainer_bin() + " generate --model " + model +
                           " --device cpu --max_new_tokens 6 --batch " + prompts;
  std::string log;
  ASSERT_EQ(run_command(base + " --batch_size 3 --output " + dir + "/b3.jsonl", &log), 0) << log;
  ASSERT_EQ(run_command(base + " --batch_size 1 --output " + dir + "/b1.jsonl", &log), 0) << log;
  const auto b3 = read_lines(dir + "/b3.jsonl"), b1 = read_lines(dir + "/b1.jsonl");
  ASSERT_EQ(b3.size(), 3u);
  ASSERT_EQ(b1.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b3[i]["line"], static_cast<int>(i + 1));
    EXPECT_EQ(b3[i]["completion"], b1[i]["completion"]) << "row " << i + 1;
    EXPECT_EQ(b3[i]["completion_tokens"], 6);
  }
  // Sampling: each row draws from the Philox stream of its own row number, so a batch of three
  // samples what each row samples alone, and the rows' streams differ.
  const std::string sampled = base + " --temperature 1.0 --seed 7";
  ASSERT_EQ(run_command(sampled + " --batch_size 3 --output " + dir + "/s3.jsonl", &log), 0) << log;
  ASSERT_EQ(run_command(sampled + " --batch_size 1 --output " + dir + "/s1.jsonl", &log), 0) << log;
  const auto s3 = read_lines(dir + "/s3.jsonl"), s1 = read_lines(dir + "/s1.jsonl");
  ASSERT_EQ(s3.size(), 3u);
  ASSERT_EQ(s1.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(s3[i]["completion"], s1[i]["completion"]) << "sampled row " << i + 1;
  EXPECT_NE(s3[0]["completion"], b3[0]["completion"]) << "temperature 1 sampled the greedy tokens";
  std::string single;
  ASSERT_EQ(run_command(trainer_bin() + " generate --model " + model +
                            " --device cpu --max_new_tokens 6 --prompt 'A' 2>/dev/null",
                        &single),
            0);
  EXPECT_EQ(single, b3[1]["completion"].get<std::string>() + "\n");
}

TEST(GenerateBatch, ConversationalPromptsAndBadInput) {
  const std::string dir = testing::temp_dir("gen");
  const std::string model = testing::make_tiny_model(dir + "/model");
  std::ofstream(dir + "/chat.jsonl") << R"({"prompt": [{"role": "user", "content": "hi"}]})"
                                     << "\n";
  std::string log;
  EXPECT_EQ(run_command(trainer_bin() + " generate --model " + model +
                            " --device cpu --max_new_tokens 3 --batch " + dir + "/chat.jsonl" +
                            " --output " + dir + "/c.jsonl",
                        &log),
            0)
      << log;
  EXPECT_EQ(read_lines(dir + "/c.jsonl").size(), 1u);
  std::ofstream(dir + "/text.jsonl") << R"({"text": "no prompt"})"
                                     << "\n";
  EXPECT_EQ(run_command(trainer_bin() + " generate --model " + model + " --device cpu --batch " +
                            dir + "/text.jsonl",
                        &log),
            2);
  EXPECT_NE(log.find("text.jsonl:1: dataset format language_modeling has no prompt"),
            std::string::npos)
      << log;
  EXPECT_EQ(run_command(trainer_bin() + " generate --model " + model + " --prompt x --batch " +
                            dir + "/text.jsonl",
                        &log),
            2);
  EXPECT_NE(log.find("give exactly one of --prompt and --batch"), std::string::npos) << log;
}

}  // namespace
}  // namespace leantune
