// --memory_trace: the allocator trace of the first memory_trace_steps updates of
// Trainer::train, written as JSON for trainer_bin memviz (docs/profiling.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/allocator.h"
#include "loaders/fs_util.h"
#include "trainers/common/metrics.h"

namespace leantune {

// Records the device allocator's trace from construction until `until_step` updates are done
// and writes it to `path`; also written when training stops early or throws (the trace of an
// out-of-memory step is the one most wanted). Besides the events, the file holds the baseline
// (bytes already allocated per tag and reserved when recording began: parameters, for one) and
// the updates recorded, so that trainer_bin memviz can show absolute figures.
class MemoryTraceScope {
 public:
  MemoryTraceScope(std::string path, int64_t first_step, int64_t until_step, Allocator& alloc)
      : path_(std::move(path)),
        first_(first_step),
        last_(first_step),
        until_(until_step),
        alloc_(alloc) {
    if (path_.empty()) return;
    const AllocatorStats st = alloc_.stats();
    baseline_ = {{"allocated", st.allocated.current},
                 {"reserved", st.reserved.current},
                 {"segments", st.segments},
                 {"by_tag", nlohmann::json::object()}};
    for (int i = 0; i < kNumMemTags; ++i)
      baseline_["by_tag"][mem_tag_name(static_cast<MemTag>(i))] = st.by_tag[i].current;
    alloc_.clear_trace();
    alloc_.set_trace_enabled(true);
  }
  ~MemoryTraceScope() {
    try {
      if (!path_.empty()) write();
    } catch (...) {
      // Already unwinding from the error that matters; the trace is lost.
    }
  }
  void after_step(int64_t step, MetricsLogger& log) {
    last_ = step;
    if (path_.empty()) return;
    step_ends_.push_back({{"step", step}, {"t_ns", alloc_.trace_clock_ns()}});
    if (step < until_) return;
    write();
    log.message("memory trace written to " + written_);
  }
  // Training ended before until_step (or stopped early): recording stops with the last step, and
  // finish() writes the trace of the steps taken once the model is saved (a full disk then
  // costs the trace, not the model), a failed write an error like any other output's.
  void stop() {
    if (!path_.empty()) alloc_.set_trace_enabled(false);
  }
  void finish(MetricsLogger& log) {
    if (path_.empty()) return;
    write();
    log.message("memory trace written to " + written_);
  }

 private:
  void write() {
    alloc_.set_trace_enabled(false);
    written_ = path_;
    path_.clear();
    nlohmann::json j = nlohmann::json::parse(alloc_.trace_json());
    alloc_.clear_trace();
    j["baseline"] = baseline_;
    j["steps"] = {first_ + 1, last_};
    j["step_ends"] = step_ends_;
    write_text_atomic(written_, j.dump());
  }
  std::string path_, written_;
  int64_t first_, last_, until_;
  Allocator& alloc_;
  nlohmann::json baseline_;
  nlohmann::json step_ends_ = nlohmann::json::array();  // [{"step", "t_ns"}] on the trace clock
};

}  // namespace leantune
