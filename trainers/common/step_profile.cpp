// --profile_steps (trainers/common/step_profile.h): which updates are profiled, and the report.
#include "trainers/common/step_profile.h"

#include <algorithm>
#include <cstdio>

#include "loaders/fs_util.h"

namespace leantune {

StepProfileRun::StepProfileRun(int64_t n, int64_t first_update, int64_t total_steps, Device device,
                               std::string json_path)
    : device_(device), json_path_(std::move(json_path)) {
  if (n <= 0) return;
  const int64_t left = total_steps - first_update + 1;
  first_ = left > n ? first_update + 1 : first_update;
  last_ = std::min(first_ + n - 1, total_steps);
}

void StepProfileRun::begin_update(int64_t update) {
  profiler_.cancel_step();
  if (update >= first_ && update <= last_) profiler_.begin_step(device_);
}

void StepProfileRun::end_update(int64_t update, MetricsLogger& log) {
  if (!profiler_.in_step()) return;
  profiler_.end_step();
  profiled_.push_back(update);
  if (update >= last_) report(log);
}

void StepProfileRun::finish(MetricsLogger& log) {
  profiler_.cancel_step();
  if (profiler_.profile().steps > 0) report(log);
}

void StepProfileRun::report(MetricsLogger& log) {
  if (reported_) return;
  reported_ = true;
  const StepProfile& p = profiler_.profile();
  std::string table = p.table();
  table.pop_back();  // the final newline: message() adds one
  log.message(table);
  if (json_path_.empty()) return;
  nlohmann::json j = p.to_json();
  j["updates"] = profiled_;
  write_text_atomic(json_path_, j.dump(2) + "\n");
  log.message("step profile written to " + json_path_);
}

}  // namespace leantune
