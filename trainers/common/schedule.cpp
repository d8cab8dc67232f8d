// Learning-rate schedules (see schedule.h).
#include "trainers/common/schedule.h"

#include <algorithm>
#include <cmath>

#include "engine/check.h"

namespace leantune {

LrSchedule parse_lr_schedule(const std::string& name) {
  if (name == "linear") return LrSchedule::kLinear;
  if (name == "cosine") return LrSchedule::kCosine;
  if (name == "constant" || name == "constant_with_warmup") return LrSchedule::kConstant;
  LT_THROW(ErrorKind::kInput, "lr_scheduler_type must be linear, cosine or constant; got '", name,
           "'");
}

LrScheduler LrScheduler::make(const std::string& type, double base_lr, int64_t total_steps,
                              int64_t warmup_steps, double warmup_ratio) {
  LrScheduler s;
  s.type = parse_lr_schedule(type);
  s.base_lr = base_lr;
  s.total_steps = total_steps;
  s.warmup_steps =
      warmup_steps > 0
          ? warmup_steps
          : static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
  return s;
}

double LrScheduler::lr(int64_t k) const {
  const double w = static_cast<double>(warmup_steps), n = static_cast<double>(total_steps);
  const double kk = static_cast<double>(k);
  if (k < warmup_steps) return base_lr * kk / std::max(1.0, w);
  switch (type) {
    case LrSchedule::kLinear:
      return base_lr * std::max(0.0, (n - kk) / std::max(1.0, n - w));
    case LrSchedule::kCosine: {
      const double progress = (kk - w) / std::max(1.0, n - w);
      return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
    case LrSchedule::kConstant:
      return base_lr;
  }
  return base_lr;
}

}  // namespace leantune
