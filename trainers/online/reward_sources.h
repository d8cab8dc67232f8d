// The rewards of the online trainers (grpo, rloo, online_dpo): several sources, each named in the
// metrics, combined with reward_weights as TRL combines its reward_funcs.
//
// Sources, from the options (declared once by reward_source_table()):
//   --reward_funcs LIST   comma-separated, in order:
//       accuracy_reward           final answer against the row's "solution" (else "answer")
//                                 column (trainers/online/rewards.h accuracy_reward); a row with
//                                 neither is Error(kInput) naming its line (checked when the data
//                                 loads)
//       format_reward             1 when --format_pattern matches from the completion's start
//       soft_overlong_punishment  DAPO's length penalty: 0 up to max_completion_length -
//                                 --soft_punish_cache tokens, then down to -1
//       a folder                  a reward model (trainer_bin reward's output, or its adapter):
//                                 prompt + completion scored as TRL scores them (standard rows:
//                                 the texts joined, tokenized without special tokens;
//                                 conversational: the prompt messages plus an assistant message,
//                                 rendered with the reward tokenizer's chat template)
//   --reward_command CMD  a persistent external process (trainers/online/rewards.h RewardCommand),
//   one
//                         JSON line {prompt, completion, every column of the row} per
//                         completion in, one reward (or null) per line out, within
//                         --reward_timeout seconds; named "reward_command". A malformed or
//                         missing answer is exit 2 naming the command and its output line.
//   --reward_weights LIST one weight per source (none: 1 each), in the order above.
// score() returns rewards[i][f] for completion i and source f (NaN = no reward); the total is
// the weighted NaN-sum, NaN when every source declined (TRL's unscorable completion).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"
#include "loaders/dataset.h"
#include "loaders/option_table.h"
#include "loaders/options.h"
#include "trainers/online/rewards.h"

namespace leantune {

class RewardModel;
class TextEncoder;

// The reward options, as given (checked when RewardSources is made).
struct RewardSourceArguments {
  std::vector<std::string> reward_funcs;
  std::string reward_command;  // empty: none
  double reward_timeout = 60.0;
  std::vector<std::string> reward_weights;  // empty: 1 each
  std::string format_pattern = "^<think>(?!.*<think>)(.*?)</think>.*$";
  int64_t soft_punish_cache = 256;
};
const OptionTable<RewardSourceArguments>& reward_source_table();

// One completion to score.
struct CompletionToScore {
  const nlohmann::json* row = nullptr;  // the dataset row: "prompt" and every other column
  std::string completion;               // decoded text (special tokens skipped)
  int64_t completion_tokens = 0;
};

class RewardSources {
 public:
  // Error(kInput) naming the option for an unknown function, a missing folder, a bad pattern or
  // a weight count that does not match. max_completion_length: soft_overlong's max_len.
  RewardSources(const RewardSourceArguments& a, int64_t max_completion_length, Device device,
                DType dtype);
  ~RewardSources();
  RewardSources(const RewardSources&) = delete;
  RewardSources& operator=(const RewardSources&) = delete;

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<double>& weights() const { return weights_; }
  // Whether a source reads the solution/answer column (the data loader checks every row).
  bool needs_solution() const;
  // `should_stop`: passed to the reward command's wait (RewardCommand::score).
  std::vector<std::vector<double>> score(const std::vector<CompletionToScore>& c,
                                         const std::function<bool()>& should_stop = {});
  // The weighted NaN-sum of one completion's rewards (NaN when all are NaN).
  double total(const std::vector<double>& per_source) const;

 private:
  enum class Kind { kAccuracy, kFormat, kOverlong, kModel, kCommand };
  struct ModelSource;
  std::vector<Kind> kinds_;
  std::vector<std::string> names_;
  std::vector<double> weights_;
  std::unique_ptr<FormatReward> format_;
  int64_t max_len_ = 0, punish_cache_ = 0;
  std::vector<std::unique_ptr<ModelSource>> models_;  // one per kModel, in order
  std::unique_ptr<RewardCommand> command_;
};

// A conversational prompt's messages; Error(kInput) naming `where` for anything but a non-empty
// list of {"role", "content"} strings.
std::vector<Message> prompt_messages(const nlohmann::json& v, const std::string& where);

// The row's solution text ("solution", else "answer"; numbers are printed), or "" when absent.
std::string row_solution(const nlohmann::json& row);

}  // namespace leantune
