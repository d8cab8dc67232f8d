// Learning-rate schedules with warmup, as transformers' get_scheduler computes them. The rate
// used by update k (0-based) is base_lr * factor(k):
//   warmup (k < W):  k / max(1, W)
//   linear:          max(0, (N - k) / max(1, N - W))
//   cosine:          max(0, 0.5 * (1 + cos(pi * (k - W) / max(1, N - W))))
//   constant:        1
// N = total updates, W = warmup_steps, or ceil(warmup_ratio * N) when warmup_steps is 0.
#pragma once

#include <cstdint>
#include <string>

namespace leantune {

enum class LrSchedule { kLinear, kCosine, kConstant };
LrSchedule parse_lr_schedule(const std::string& name);

struct LrScheduler {
  LrSchedule type = LrSchedule::kLinear;
  double base_lr = 0;
  int64_t total_steps = 0;
  int64_t warmup_steps = 0;
  static LrScheduler make(const std::string& type, double base_lr, int64_t total_steps,
                          int64_t warmup_steps, double warmup_ratio);
  double lr(int64_t update) const;
};

}  // namespace leantune
