// Evaluation during training, as transformers' Trainer schedules it, for every trainer:
//   eval_strategy   no | steps (every eval_steps updates; 0 = logging_steps, transformers'
//                   None) | epoch (after each epoch's last update)
//   eval_on_start   one evaluation before the first update (logged at the run's start step)
//   metric_for_best_model / greater_is_better: the evaluation metric whose best value is
//                   tracked (best_metric, best_global_step and best_model_checkpoint in
//                   trainer_state.json); "loss" by default, a name without "eval_" gets it;
//                   greater_is_better defaults to false for a name ending in "loss"
//   load_best_model_at_end: the weights of the best checkpoint are loaded before the final
//                   model is written (save_strategy must match eval_strategy; with steps,
//                   save_steps a multiple of eval_steps), and rotation never deletes that
//                   checkpoint.
// A trainer's evaluate() returns its metrics without the prefix ({"loss": ..., "rewards/...":
// ...}); the loop logs them as eval_<name>, with eval_runtime (seconds), at the update's step.
// Unlike transformers, a run given evaluation data also evaluates once at the end when its last
// update was not just evaluated (the command's summary and the API's eval_loss).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "loaders/option_table.h"

namespace leantune {

struct EvalArguments {
  int64_t per_device_eval_batch_size = 8;
  std::string eval_strategy = "no";
  double eval_steps = 0;  // 0: logging_steps; below 1, a ratio of all updates
  bool eval_on_start = false;
  bool load_best_model_at_end = false;
  std::string metric_for_best_model = "loss";
  std::optional<bool> greater_is_better;  // none: false for a metric ending in "loss"
};
const OptionTable<EvalArguments>& eval_table();

// Reads and checks the evaluation options against the save options that load_best_model_at_end
// needs (transformers' rules). --eval_steps given without --eval_strategy means steps (leantune's
// older form); with --eval_strategy no it is refused, as an option that would do nothing.
EvalArguments eval_arguments(const Options& o, const std::string& save_strategy, double save_steps,
                             double logging_steps);

// A step count as transformers reads logging_steps, save_steps and eval_steps: from 1 a number of
// updates, below 1 the ratio of `total_steps` rounded up (0 stays 0).
int64_t resolve_steps(double steps, int64_t total_steps);
// Error(kInput) naming the option unless `steps` is an integer from 1, or a ratio in [0, 1).
void check_steps(const char* option, double steps);

// "eval_" + metric_for_best_model unless it has the prefix already.
std::string best_metric_key(const EvalArguments& a);
bool greater_is_better(const EvalArguments& a);
// Whether the update that just completed (`step`, 1-based) is followed by an evaluation;
// `eval_every`: eval_steps resolved (resolve_steps).
bool eval_due(const EvalArguments& a, int64_t eval_every, int64_t step, int64_t updates_per_epoch);

// The best evaluation of the run so far (transformers' TrainerState best_* fields).
struct BestModel {
  std::optional<double> metric;
  int64_t step = 0;
  std::string checkpoint;  // the checkpoint saved at `step` ("" when none was)
};
// Updates `best` with an evaluation record (keys eval_*); Error(kInput) naming the option when
// the record lacks the metric (the message lists the ones it has). Returns whether it improved.
bool update_best(BestModel& best, const EvalArguments& a, const nlohmann::json& record,
                 int64_t step);
nlohmann::json best_to_json(const BestModel& best);
// Error(kInput) naming `source` for a malformed value; null: no best yet.
BestModel best_from_json(const nlohmann::json& j, const std::string& source);

// The progress line of an evaluation record: "eval step 10 | loss 1.2345 | rewards/accuracies
// 0.7500 | 0.4 s".
std::string format_eval_line(const nlohmann::json& record);

}  // namespace leantune
