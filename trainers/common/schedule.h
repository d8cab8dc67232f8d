// Learning-rate schedules, as transformers 5's get_scheduler computes them (its lr_lambda
// functions, optimization.py). The rate used by update k (0-based) is base_lr * factor(k), with
// N = total updates, W = warmup updates, p = (k - W) / max(1, N - W):
//   warmup (k < W, all but constant):  k / max(1, W)
//   linear                max(0, (N - k) / max(1, N - W))
//   cosine                max(0, 0.5 (1 + cos(pi c 2 p)))                      c = num_cycles, 0.5
//   cosine_with_restarts  0 from p >= 1, else max(0, 0.5 (1 + cos(pi ((c p) mod 1))))  c = 1
//   cosine_with_min_lr    max(0, cosine (1 - r) + r), r = min_lr_rate or min_lr / base_lr
//   polynomial            (base - end) (1 - p)^power + end, over base; end / base past N
//                         (lr_end 1e-7, power 1; lr_end must be below the base rate)
//   constant              1 (no warmup: transformers' get_constant_schedule)
//   constant_with_warmup  1 after the warmup
//   inverse_sqrt          1 / sqrt((k + t - W) / t), t = timescale (default W, or 10000)
//   warmup_stable_decay   warmup (warmup_type linear | cosine | 1-sqrt, from min_lr_ratio),
//                         stable at 1 for num_stable_steps (default N - W - num_decay_steps),
//                         decay over num_decay_steps (decay_type, default cosine) to
//                         min_lr_ratio, then min_lr_ratio
// W = warmup_steps, or ceil(warmup_ratio N) when warmup_steps is 0. kwargs: transformers'
// lr_scheduler_kwargs for the schedule (num_cycles, min_lr, min_lr_rate, lr_end, power,
// timescale, num_decay_steps, num_stable_steps, warmup_type, decay_type, min_lr_ratio); a key the
// schedule does not take, a value of the wrong type or range, or a missing required one is an
// Error(kInput) naming it.
// reduce_lr_on_plateau is torch's ReduceLROnPlateau, as transformers' Trainer drives it: the rate
// starts at base_lr (no warmup) and changes only when an evaluation reports its metric
// (observe(); metric_for_best_model): after more than `patience` evaluations without an
// improvement (threshold, threshold_mode rel|abs, mode min|max) it is multiplied by `factor`
// (never below min_lr, nor by a change smaller than eps), then `cooldown` evaluations pass
// before bad ones count again. kwargs: mode (min), factor (0.1), patience (10), threshold
// (1e-4), threshold_mode (rel), cooldown (0), min_lr (0), eps (1e-8). Its state goes into
// checkpoints (state()/set_state()).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace leantune {

enum class LrSchedule {
  kLinear,
  kCosine,
  kCosineWithRestarts,
  kCosineWithMinLr,
  kPolynomial,
  kConstant,
  kConstantWithWarmup,
  kInverseSqrt,
  kReduceLrOnPlateau,
  kWarmupStableDecay
};
// The names lr_scheduler_type accepts, in transformers' order.
const std::vector<std::string>& lr_schedule_names();
LrSchedule parse_lr_schedule(const std::string& name);

struct LrScheduler {
  LrSchedule type = LrSchedule::kLinear;
  double base_lr = 0;
  int64_t total_steps = 0;
  int64_t warmup_steps = 0;
  // The schedule's parameters (kwargs or transformers' defaults).
  double num_cycles = 0.5;
  double min_lr_rate = 0;                             // cosine_with_min_lr
  double lr_end = 1e-7, power = 1.0;                  // polynomial
  double timescale = 0;                               // inverse_sqrt
  int64_t num_stable_steps = 0, num_decay_steps = 0;  // warmup_stable_decay
  std::string warmup_type = "linear", decay_type = "cosine";
  double min_lr_ratio = 0;
  // reduce_lr_on_plateau: its parameters, then its state.
  bool plateau_max = false, plateau_rel = true;
  double factor = 0.1, threshold = 1e-4, min_lr = 0, eps = 1e-8;
  int64_t patience = 10, cooldown = 0;
  double current_lr = 0;
  std::optional<double> plateau_best;
  int64_t num_bad = 0, cooldown_counter = 0;

  static LrScheduler make(const std::string& type, double base_lr, int64_t total_steps,
                          int64_t warmup_steps, double warmup_ratio,
                          const nlohmann::json& kwargs = nlohmann::json::object());
  double lr(int64_t update) const;
  // reduce_lr_on_plateau: an evaluation's metric (no-op for the other schedules).
  void observe(double metric);
  // reduce_lr_on_plateau's state (null for the stateless schedules); set_state: Error(kInput)
  // naming `source` for a malformed one.
  nlohmann::json state() const;
  void set_state(const nlohmann::json& s, const std::string& source);
};

// Parses --lr_scheduler_kwargs (a JSON object; empty text: none). Error(kInput) for other text.
nlohmann::json parse_lr_scheduler_kwargs(const std::string& text);

}  // namespace leantune
