// --profile_steps N: the per-op step profile (engine/profile.h) of N training updates, taken by
// Trainer::train for every trainer. Updates 2..N+1 are profiled (the first is warm-up: allocator
// growth, cuBLASLt plans, page faults), or updates 1..N when the run has N updates or fewer
// left. When the last profiled update ends (or training ends first), the table is printed on
// stderr and written as <output_dir>/profile.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/profile.h"
#include "trainers/common/metrics.h"

namespace leantune {

class StepProfileRun {
 public:
  // Updates first_update .. total_steps remain to be run in this process; n = 0 profiles nothing.
  // json_path "" (ranks other than 0): the table is printed, no file is written.
  StepProfileRun(int64_t n, int64_t first_update, int64_t total_steps, Device device,
                 std::string json_path);
  // Around each update: begin before its first micro-batch, end after the optimizer step. An
  // update that ends another way (skipped, abandoned) is dropped by the next begin or finish.
  void begin_update(int64_t update);
  void end_update(int64_t update, MetricsLogger& log);
  // Training is over: reports the steps profiled so far, if not reported yet.
  void finish(MetricsLogger& log);
  int64_t first() const { return first_; }
  int64_t last() const { return last_; }

 private:
  void report(MetricsLogger& log);
  int64_t first_ = 0, last_ = -1;  // the updates to profile, inclusive
  Device device_;
  std::string json_path_;
  std::vector<int64_t> profiled_;  // the updates in the profile
  bool reported_ = false;
  StepProfiler profiler_;
};

}  // namespace leantune
