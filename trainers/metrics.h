// Training output: output_dir/metrics.jsonl (one JSON object per logged step, appended and
// flushed), a progress bar on a terminal or plain log lines otherwise, and memory snapshots
// from the caching allocator of the training device.
#pragma once

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/allocator.h"

namespace leantune {

// {"allocated", "peak_allocated", "reserved", "peak_reserved", "by_tag": {tag: {"current",
// "peak"}}} in bytes, plus device totals from cudaMemGetInfo on CUDA.
nlohmann::json memory_snapshot(Device device);
// The process's resident set (VmRSS) or its high-water mark (VmHWM) from /proc/self/status, in
// bytes; 0 where that file does not exist.
int64_t process_rss_bytes(bool high_water_mark);

class MetricsLogger {
 public:
  // metrics_path empty = no file. resume=true appends to an existing file after dropping
  // records with step > start_step (written after the checkpoint we resume from).
  MetricsLogger(const std::string& metrics_path, int64_t total_steps, bool resume,
                int64_t start_step);
  ~MetricsLogger();
  void log(const nlohmann::json& record);  // writes one line; prints progress or a log line
  void message(const std::string& text);   // a line on stderr that does not break the bar
  void finish();

 private:
  void print_progress(const nlohmann::json& r);
  std::FILE* file_ = nullptr;
  int64_t total_steps_;
  bool tty_;
  bool bar_shown_ = false;
  std::chrono::steady_clock::time_point start_;
  int64_t start_step_;
};

}  // namespace leantune
