// online_dpo's pairwise judges (trainers/online/judges.h): a command's verdicts mapped back
// through the random order the pair was shown in, the order seeded, no verdict (-1, null) kept
// as -1, anything else an input error naming the command; what the command reads; trainer_bin
// online_dpo --judge on the built-in task (TRL's rule: rank 0 takes the first, anything else the
// second) and the refusal of a judge beside reward sources.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/check.h"
#include "testing/testing.h"
#include "trainers/online/judges.h"
#include "trainers/online/reward_sources.h"
#include "trainers/trainer_test_util.h"

namespace leantune {
namespace {

std::string script(const std::string& name, const std::string& body) {
  const std::string path = testing::temp_dir("judge_" + name) + "/judge.sh";
  std::ofstream(path) << "#!/usr/bin/env bash\n" << body;
  return "bash " + path;
}

PairwiseJudge command_judge(const std::string& cmd, uint64_t seed = 3) {
  return PairwiseJudge(cmd, 30.0, seed, Device::cpu(), DType::kF32, 16);
}

// 40 pairs, the "good" one first in even pairs and second in odd ones.
std::vector<JudgePair> good_bad_pairs(const nlohmann::json& row) {
  std::vector<JudgePair> p;
  for (int i = 0; i < 40; ++i)
    p.push_back(i % 2 == 0 ? JudgePair{&row, "good", "bad", 1, 1}
                           : JudgePair{&row, "bad", "good", 1, 1});
  return p;
}

TEST(Judges, VerdictsAreMappedBackThroughTheShownOrder) {
  const nlohmann::json row = {{"prompt", "which?"}, {"answer", "4"}};
  PairwiseJudge j = command_judge(
      script("good",
             "while IFS= read -r l; do [[ $l == *'\"completions\":[\"good\"'* ]] && echo 0 || "
             "echo 1; done\n"));
  const std::vector<int> ranks = j.judge(good_bad_pairs(row));
  ASSERT_EQ(ranks.size(), 40u);
  for (size_t i = 0; i < ranks.size(); ++i) EXPECT_EQ(ranks[i], i % 2 == 0 ? 0 : 1) << i;
}

TEST(Judges, TheShownOrderIsRandomAndSeeded) {
  const nlohmann::json row = {{"prompt", "p"}};
  const std::string first = script("first", "while IFS= read -r l; do echo 0; done\n");
  auto run = [&](uint64_t seed) {
    PairwiseJudge j = command_judge(first, seed);
    return j.judge(good_bad_pairs(row));
  };
  const std::vector<int> a = run(7), b = run(7), c = run(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int ones = 0;
  for (int r : a) ones += r;
  EXPECT_GT(ones, 5);  // a judge that always prefers what it sees first is right about half
  EXPECT_LT(ones, 35);
}

TEST(Judges, NoVerdictIsMinusOneAndOtherAnswersAreErrors) {
  const nlohmann::json row = {{"prompt", "p"}};
  const std::vector<JudgePair> two = {{&row, "a", "b", 1, 1}, {&row, "c", "d", 1, 1}};
  PairwiseJudge none =
      command_judge(script("none",
                           "n=0; while IFS= read -r l; do n=$((n+1)); [ $n = 1 ] && echo null || "
                           "echo -1; done\n"));
  EXPECT_EQ(none.judge(two), (std::vector<int>{-1, -1}));
  PairwiseJudge bad = command_judge(script("bad", "while IFS= read -r l; do echo 2; done\n"));
  try {
    bad.judge(two);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("judge command 'bash"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("answer 1 of batch 1 is 2"), std::string::npos)
        << e.what();
  }
  PairwiseJudge words =
      command_judge(script("words", "while IFS= read -r l; do echo first; done\n"));
  try {
    words.judge(two);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("judge command '"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PairwiseJudge("", 30, 1, Device::cpu(), DType::kF32, 16), Error);
  const std::string empty_dir = testing::temp_dir("judge_empty_dir");
  EXPECT_THROW(PairwiseJudge(empty_dir, 30, 1, Device::cpu(), DType::kF32, 16), Error);
}

TEST(Judges, TheCommandReadsThePromptBothCompletionsAndTheColumns) {
  const std::string dir = testing::temp_dir("judge_reads");
  const nlohmann::json row = {{"prompt", {{{"role", "user"}, {"content", "hi"}}}}, {"answer", "4"}};
  PairwiseJudge j = command_judge("bash -c 'while IFS= read -r l; do printf \"%s\\n\" \"$l\" >> " +
                                  dir + "/seen.jsonl; echo 0; done'");
  j.judge({{&row, "one", "two", 1, 1}});
  std::ifstream in(dir + "/seen.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const nlohmann::json seen = nlohmann::json::parse(line);
  EXPECT_EQ(seen["prompt"], row["prompt"]);
  EXPECT_EQ(seen["answer"], "4");
  ASSERT_EQ(seen["completions"].size(), 2u);
  const std::string a = seen["completions"][0], b = seen["completions"][1];
  EXPECT_TRUE((a == "one" && b == "two") || (a == "two" && b == "one")) << line;
}

// A reward model folder as the judge: each pair's rank is the comparison of the two scores the
// same model gives as a reward source (ties: the first), whatever the order.
TEST(Judges, ARewardModelJudgesByItsScores) {
  const std::string dir = testing::temp_dir("judge_rm");
  std::string log;
  ASSERT_EQ(testing::run_command(testing::trainer_bin() +
                                     " reward --max_steps 2 --save_steps 0 "
                                     "--device cpu --output_dir " +
                                     dir + "/rm 2>&1",
                                 &log),
            0)
      << log;
  const nlohmann::json row = {{"prompt", "Once upon a time"}};
  const std::vector<std::string> texts = {" there was a cat.", " the end", " a dog ran home.",
                                          " 42"};
  RewardSourceArguments a;
  a.reward_funcs = {dir + "/rm"};
  RewardSources scorer(a, 16, Device::cpu(), DType::kF32);
  std::vector<CompletionToScore> c;
  for (const std::string& t : texts) c.push_back({&row, t, 4});
  const std::vector<std::vector<double>> s = scorer.score(c);
  PairwiseJudge judge(dir + "/rm", 30.0, 1, Device::cpu(), DType::kF32, 16);
  EXPECT_EQ(judge.describe(), "reward model " + dir + "/rm");
  std::vector<JudgePair> pairs;
  std::vector<int> want;
  for (size_t i = 0; i < texts.size(); ++i)
    for (size_t j = 0; j < texts.size(); ++j) {
      pairs.push_back({&row, texts[i], texts[j], 4, 4});
      want.push_back(s[i][0] >= s[j][0] ? 0 : 1);
    }
  EXPECT_EQ(judge.judge(pairs), want);
  int firsts = 0;
  for (int r : want) firsts += r == 0;
  EXPECT_LT(firsts, static_cast<int>(want.size()));  // the scores are not all equal
}

// The built-in task judged by a command that prefers a completion starting with a digit: the
// pairs get verdicts, the policy learns, and no reward metric is logged (TRL logs none under a
// judge).
TEST(Judges, OnlineDpoTrainsWithAJudge) {
  const std::string out = testing::temp_dir("online_dpo_judge");
  const std::string judge = testing::fixture_path("online/digit_judge.sh");
  std::string log;
  ASSERT_EQ(testing::run_command("cd " + out + " && " + testing::trainer_bin() +
                                     " online_dpo --device cpu --max_steps 6 --logging_steps 2 "
                                     "--judge 'bash " +
                                     judge + "' 2>&1",
                                 &log),
            0)
      << log;
  EXPECT_NE(log.find("judge command 'bash"), std::string::npos) << log;
  std::ifstream in(out + "/trainer_output/embedded_online_dpo/metrics.jsonl");
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(in, line);) recs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(recs.size(), 3u) << log;
  for (const nlohmann::json& r : recs) {
    EXPECT_TRUE(r.contains("rewards/accuracies")) << r.dump();
    EXPECT_TRUE(r.contains("judge/no_verdict")) << r.dump();
    EXPECT_GE(r["judge/no_verdict"].get<double>(), 0.0);
    EXPECT_FALSE(r.contains("reward")) << r.dump();
    EXPECT_FALSE(r.contains("objective/scores")) << r.dump();
  }
  // A judge beside reward sources given on the command line is refused, not ignored.
  const int rc = testing::run_command("cd " + out + " && " + testing::trainer_bin() +
                                          " online_dpo --device cpu --max_steps 1 --judge 'bash " +
                                          judge + "' --reward_funcs accuracy_reward 2>&1",
                                      &log);
  EXPECT_EQ(rc, 2) << log;
  EXPECT_NE(log.find("option --judge: give a judge or reward sources"), std::string::npos) << log;
  EXPECT_EQ(testing::run_command("cd " + out + " && " + testing::trainer_bin() +
                                     " online_dpo --device cpu --max_steps 1 --judge 'bash " +
                                     judge + "' --missing_eos_penalty 1 2>&1",
                                 &log),
            2)
      << log;
  EXPECT_NE(log.find("option --missing_eos_penalty: it lowers rewards, and --judge gives none"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace leantune
