// online_dpo's pairwise judges (--judge), TRL's BasePairwiseJudge: for each prompt and its two
// completions a rank, 0 when the first is better, 1 when the second is, -1 when the judge gave
// no verdict. online_dpo then takes the first as chosen when the rank is 0 and the second
// otherwise, failures included, as TRL's OnlineDPOTrainer does (mask = rank == 0). TRL 1.16's
// experimental OnlineDPOTrainer has only reward functions; the judges and this rule are those of
// TRL 0.29 (trl.experimental.judges), the last release that had them.
//
// --judge SPEC:
//   a folder holding config.json   a reward model (trainer_bin reward's output, or its adapter):
//                                  both completions scored as --reward_funcs scores them; rank 0
//                                  when the first's score is >= the second's (ties: the first,
//                                  as TRL's reward comparison), -1 when either has no score
//   anything else                  a command (sh -c, kept for the whole run, as --reward_command):
//                                  one JSON line per pair on stdin, {"prompt": the row's prompt as
//                                  given (a string or its messages), "completions": [A, B], and
//                                  every other column of the row}, one answer per line on stdout:
//                                  0 (A is better), 1 (B), -1 or null (no verdict). The pair is
//                                  shown in a random order (seeded by --seed; TRL's judges shuffle
//                                  by default against position bias) and the answer mapped back.
//                                  Any other answer, an exit, or a late batch (--reward_timeout)
//                                  is exit 2 naming the command.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"

namespace leantune {

class RewardCommand;
class RewardSources;

struct JudgePair {
  const nlohmann::json* row = nullptr;  // the dataset row: "prompt" and every other column
  std::string first, second;            // the completions' texts
  int64_t first_tokens = 0, second_tokens = 0;
};

class PairwiseJudge {
 public:
  PairwiseJudge(const std::string& spec, double timeout_seconds, uint64_t seed, Device device,
                DType dtype, int64_t max_completion_length);
  ~PairwiseJudge();
  PairwiseJudge(const PairwiseJudge&) = delete;
  PairwiseJudge& operator=(const PairwiseJudge&) = delete;

  // One rank per pair (0, 1 or -1). `should_stop` as in RewardCommand::score.
  std::vector<int> judge(const std::vector<JudgePair>& pairs,
                         const std::function<bool()>& should_stop = {});
  // "reward model <folder>" or "command '<cmd>'", for the run's log.
  const std::string& describe() const { return describe_; }

 private:
  std::unique_ptr<RewardSources> model_;
  std::unique_ptr<RewardCommand> command_;
  std::string spec_, describe_;
  std::mt19937_64 rng_;
  int64_t batches_ = 0;
};

}  // namespace leantune
