// Reward sources of the online trainers (grpo, rloo, online_dpo) that need no model: verifiable
// rewards computed from the text, and an external command that scores completions.
//
// accuracy_reward(completion, solution): 1 when the completion's final answer equals the
//   solution's, else 0. The final answer of a text is the content of its last \boxed{...}
//   (nested braces counted), else what follows its last GSM8K "####" marker, else its last
//   number. Answers compare as numbers when both read as one (commas, '$' and a trailing '.'
//   dropped; equal within 1e-6 relative), else as text with whitespace collapsed. A solution
//   with no answer in it scores 0 and is counted by the caller. (TRL's accuracy_reward parses
//   LaTeX with math_verify; this covers numbers, "####" and \boxed{}.)
// format_reward(completion, pattern): 1 when the pattern matches from the completion's start,
//   as Python's re.match(pattern, text, re.DOTALL | re.MULTILINE) does for the patterns TRL's
//   examples use: ECMAScript syntax (std::regex), '^'/'$' at line ends, and '.' outside a
//   bracket expression matching newlines too. A bad pattern is Error(kInput) naming it.
// soft_overlong_punishment(length, max_len, cache): DAPO's length penalty as TRL's
//   get_soft_overlong_punishment: 0 up to max_len - cache tokens, then falling linearly to -1
//   at max_len, and -1 beyond.
//
// RewardCommand: a persistent process (`sh -c COMMAND`, trainers/common/child_process.h: a process
//   group of its own, ended with SIGTERM then SIGKILL on every exit path) that reads one JSON
//   object per line on stdin ({"prompt", "completion", and every dataset column of the row}) and
//   writes one reward per line on stdout, in order: a finite number, or null for "no reward"
//   (NaN, left out of the group's baseline). Lines go in batches: all of a batch's lines are
//   written, then as many answers read. Error(kInput) (exit 2), one line naming the command and
//   the answer's line of its output, for: an answer that is not a finite number or null (a
//   blank line, text, nan, inf, 1e999), more answers than a batch's inputs (seen at the end of
//   the batch or the start of the next), the process's exit (with its exit code), or a batch not
//   answered within the timeout (--reward_timeout). The process is ended after such an error and
//   at destruction. Users keep Python reward functions this way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "trainers/common/child_process.h"

namespace leantune {

// The final answer of a text (see above), or nullopt when it has none.
std::optional<std::string> final_answer(const std::string& text);
double accuracy_reward(const std::string& completion, const std::string& solution);

class FormatReward {
 public:
  explicit FormatReward(const std::string& pattern);
  double operator()(const std::string& completion) const;

 private:
  std::string pattern_;
  std::regex re_;
};

double soft_overlong_punishment(int64_t length, int64_t max_len, int64_t cache);

class RewardCommand {
 public:
  // what: its name in errors ("reward command", "judge command").
  RewardCommand(std::string command, double timeout_seconds, std::string what = "reward command");
  ~RewardCommand();
  RewardCommand(const RewardCommand&) = delete;
  RewardCommand& operator=(const RewardCommand&) = delete;
  // One reward per row (NaN for null). `should_stop`, when given, is asked at least every 100 ms
  // while the answers are awaited: true throws StopRequested (trainers/common/stop_signal.h).
  std::vector<double> score(const std::vector<nlohmann::json>& rows,
                            const std::function<bool()>& should_stop = {});

 private:
  // Ends the process; the error names the command. `exited`: it closed its output, so its exit
  // status is awaited (briefly) for the message.
  [[noreturn]] void fail(const std::string& why, bool exited = false);
  // Appends whatever the process has written to buffer_, without waiting; false once it has
  // closed its output.
  bool drain();
  // Error when buffer_ holds anything: answers beyond the `inputs` of batch `batch`.
  void check_no_extra_answers(size_t inputs, int64_t batch);
  std::string command_;
  std::string what_;
  double timeout_;
  std::unique_ptr<ChildProcess> child_;
  std::string buffer_;
  int64_t lines_ = 0;    // answer lines read so far: the line numbers of its output
  int64_t batches_ = 0;  // batches sent so far
  size_t last_inputs_ = 0;
};

}  // namespace leantune
