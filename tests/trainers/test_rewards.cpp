// Verifiable rewards and the external reward command (trainers/online/rewards.h): final answers
// from \boxed{} (nested, the last one), GSM8K's "####" and the last number; numeric comparison with
// commas, '$' and trailing dots; format patterns as re.match with DOTALL/MULTILINE (TRL's
// think_format_reward pattern on its own examples); DAPO's soft overlong punishment (TRL's
// docstring example); and a command that answers, answers null, prints garbage or too many
// answers, exits early or hangs: each failure is one Error naming the command and its output
// line, within the timeout, and the command's whole process group is gone afterwards (SIGTERM,
// then SIGKILL for one that ignores it); a stop request ends the wait at once.
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "testing/testing.h"
#include "trainers/common/stop_signal.h"
#include "trainers/online/rewards.h"

namespace leantune {
namespace {

TEST(Rewards, FinalAnswers) {
  EXPECT_EQ(final_answer("so \\boxed{3} then \\boxed{\\frac{1}{2}}").value(), "\\frac{1}{2}");
  EXPECT_EQ(final_answer("Natalia sold 48/2 = 24 clips.\n#### 72").value(), "72");
  EXPECT_EQ(final_answer("#### 72\nDone").value(), "72");
  EXPECT_EQ(final_answer("It costs $1,234.50 in total.").value(), "$1,234.50");
  EXPECT_FALSE(final_answer("no answer here").has_value());
  EXPECT_FALSE(final_answer("\\boxed{unclosed").has_value() &&
               final_answer("\\boxed{unclosed")->find("unclosed") != std::string::npos);
}

TEST(Rewards, Accuracy) {
  EXPECT_EQ(accuracy_reward("The answer is 72.", "... #### 72"), 1.0);
  EXPECT_EQ(accuracy_reward("\\boxed{1,234}", "#### 1234"), 1.0);
  EXPECT_EQ(accuracy_reward("\\boxed{72.0}", "\\boxed{72}"), 1.0);
  EXPECT_EQ(accuracy_reward("The answer is 71.", "#### 72"), 0.0);
  EXPECT_EQ(accuracy_reward("\\boxed{x + 1}", "\\boxed{x  +  1}"), 1.0);
  EXPECT_EQ(accuracy_reward("\\boxed{x + 2}", "\\boxed{x + 1}"), 0.0);
  EXPECT_EQ(accuracy_reward("nothing", "#### 5"), 0.0);
  EXPECT_EQ(accuracy_reward("5", "no answer in the solution"), 0.0);
}

TEST(Rewards, FormatAsTrlThinkFormat) {
  const FormatReward think(R"(^<think>(?!.*<think>)(.*?)</think>.*$)");
  EXPECT_EQ(think("<think>\nThis is my reasoning.\n</think>\nThis is my answer."), 1.0);
  EXPECT_EQ(think("<think>\nThis is my reasoning.\nThis is my answer."), 0.0);
  EXPECT_EQ(think("Answer first <think>x</think>"), 0.0);    // re.match: from the start
  EXPECT_EQ(FormatReward(R"(\d+\.\d)")("3.5 apples"), 1.0);  // an escaped dot stays a dot
  EXPECT_EQ(FormatReward(R"(\d+\.\d)")("35 apples"), 0.0);
  EXPECT_THROW(FormatReward("(unbalanced"), Error);
}

TEST(Rewards, SoftOverlongPunishment) {
  EXPECT_EQ(soft_overlong_punishment(90, 100, 20), -0.5);  // TRL's docstring example
  EXPECT_EQ(soft_overlong_punishment(80, 100, 20), 0.0);
  EXPECT_EQ(soft_overlong_punishment(100, 100, 20), -1.0);
  EXPECT_EQ(soft_overlong_punishment(101, 100, 20), -1.0);
}

std::vector<nlohmann::json> rows(int n) {
  std::vector<nlohmann::json> r;
  for (int i = 0; i < n; ++i) r.push_back({{"prompt", "p"}, {"completion", std::to_string(i)}});
  return r;
}

TEST(RewardCommand, ScoresBatchesAndNulls) {
  // Each line's completion length as the reward; every third answer null.
  RewardCommand cmd(
      "i=0; while IFS= read -r line; do i=$((i+1)); if [ $((i % 3)) -eq 0 ]; then echo null; "
      "else echo \"${#line}\"; fi; done",
      10);
  const std::vector<double> a = cmd.score(rows(5));
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a[0], static_cast<double>(nlohmann::json(rows(1)[0]).dump().size()));
  EXPECT_TRUE(std::isnan(a[2]));
  // The process persists: its counter goes on in a second batch (its 6th line is null).
  const std::vector<double> b = cmd.score(rows(1));
  EXPECT_TRUE(std::isnan(b[0]));
  // A batch larger than the socket buffers on both sides does not deadlock.
  std::vector<nlohmann::json> big;
  for (int i = 0; i < 3000; ++i)
    big.push_back({{"prompt", std::string(200, 'x')}, {"completion", "c"}});
  EXPECT_EQ(cmd.score(big).size(), 3000u);
}

TEST(RewardCommand, FailuresNameTheCommand) {
  // Two batches, apart as an update keeps them: answers beyond the first batch's inputs are found
  // at its end or, when they come later, at the start of the second.
  auto message = [](const std::string& command, double timeout) {
    try {
      RewardCommand cmd(command, timeout);
      cmd.score(rows(2));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      cmd.score(rows(2));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message("while read -r l; do echo abc; done", 10);
  EXPECT_NE(m.find("reward command 'while read -r l; do echo abc; done'"), std::string::npos) << m;
  EXPECT_NE(m.find("output line 1 ('abc') is not a finite number or null (answer 1 of 2 of "
                   "batch 1)"),
            std::string::npos)
      << m;
  m = message("read -r l; echo 1; echo 0.5e309", 10);
  EXPECT_NE(m.find("output line 2 ('0.5e309') is not a finite number"), std::string::npos) << m;
  m = message("read -r l; exit 3", 10);
  EXPECT_NE(m.find("exited after 0 answer(s) of 2 of batch 1 (exit code 3)"), std::string::npos)
      << m;
  m = message("while read -r l; do echo 1; echo 2; done", 10);
  EXPECT_NE(m.find("output line 3 ('1') is more answers than the 2 inputs of batch 1"),
            std::string::npos)
      << m;
  const auto t0 = std::chrono::steady_clock::now();
  m = message("sleep 30", 1);
  EXPECT_NE(m.find("0 answer(s) of 2 of batch 1 within 1 s (--reward_timeout"), std::string::npos)
      << m;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_THROW(RewardCommand("", 1), Error);
}

// Answers beyond a batch's inputs that come late are found at the start of the next batch.
TEST(RewardCommand, LateExtraAnswersFailTheNextBatch) {
  RewardCommand cmd("while read -r l; do echo 1; sleep 0.3; echo 2; done", 10);
  EXPECT_EQ(cmd.score(rows(1)).size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  try {
    cmd.score(rows(1));
    FAIL() << "the second answer of batch 1 was taken for batch 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output line 2 ('2') is more answers than the 1 inputs "
                                         "of batch 1"),
              std::string::npos)
        << e.what();
  }
}

// The process group id the command wrote to `file` (its shell's pid, the group's leader).
pid_t group_of(const std::string& file) {
  std::ifstream in(file);
  pid_t pgid = 0;
  in >> pgid;
  return pgid;
}
bool group_alive(pid_t pgid) { return ::kill(-pgid, 0) == 0 || errno != ESRCH; }

TEST(RewardCommand, EndsItsWholeProcessGroup) {
  const std::string file = testing::temp_dir("reward_group") + "/pgid";
  // A pipeline that never answers: the error ends the shell and both of its children.
  try {
    RewardCommand cmd("echo $$ >" + file + "; sleep 300 | cat", 0.5);
    cmd.score(rows(1));
    FAIL() << "no timeout";
  } catch (const Error&) {
  }
  pid_t pgid = group_of(file);
  ASSERT_GT(pgid, 1);
  EXPECT_FALSE(group_alive(pgid));
  // A helper in the background and a shell that ignores SIGTERM: the destructor of a command
  // that answered well ends them too, with SIGKILL after the grace period.
  auto t0 = std::chrono::steady_clock::now();
  {
    RewardCommand cmd("echo $$ >" + file +
                          "; trap '' TERM; sleep 300 </dev/null >/dev/null & "
                          "while read -r l; do echo 1; done",
                      10);
    EXPECT_EQ(cmd.score(rows(2)), std::vector<double>({1.0, 1.0}));
    pgid = group_of(file);
    ASSERT_GT(pgid, 1);
    EXPECT_TRUE(group_alive(pgid));
  }
  EXPECT_FALSE(group_alive(pgid));
  EXPECT_GE(std::chrono::steady_clock::now() - t0,
            std::chrono::milliseconds(static_cast<int>(kChildGraceSeconds * 1000) - 100));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
}

TEST(RewardCommand, AStopRequestEndsTheWait) {
  RewardCommand cmd("sleep 300", 60);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(cmd.score(rows(1), [] { return true; }), StopRequested);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

}  // namespace
}  // namespace leantune
