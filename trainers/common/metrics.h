// Training output: output_dir/metrics.jsonl (one JSON object per logged step, appended and
// flushed), a progress bar on a terminal or plain log lines otherwise (through engine/log.h: an
// embedder's log sink gets the lines, never the bar), and memory snapshots from the caching
// allocator of the training device.
//
// A record that cannot be written (a full disk) is cut back out of the file, so no torn line
// remains, and counted: a warning names the file and the count of lost records when the first
// is lost and when the count doubles, and finish() reports the total. Training goes on: the
// metrics are a log, the checkpoints are what matters.
//
// No record holds NaN, an infinity or null where a number is expected (JSON has no non-finite
// numbers, and a reader's average would be poisoned by one): a window averages each metric over
// its finite values only, a metric with none in the window is left out of the record, and
// MetricsLogger::log drops any non-finite number that remains. The trainer counts the updates of
// the window skipped for a non-finite loss or gradient in `nonfinite_steps`.
#pragma once

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/log.h"

namespace leantune {

class TensorBoardWriter;

// {"allocated", "peak_allocated", "reserved", "peak_reserved", "by_tag": {tag: {"current",
// "peak"}}} in bytes, plus device totals from cudaMemGetInfo on CUDA.
nlohmann::json memory_snapshot(Device device);
// The process's resident set (VmRSS) or its high-water mark (VmHWM) from /proc/self/status, in
// bytes; 0 where that file does not exist.
int64_t process_rss_bytes(bool high_water_mark);

// The per-micro-batch metrics of a trainer (every one but sft) summed over a logging window and
// averaged over its micro-batches when logged, as TRL averages its metric lists; every logged
// row is kept (tests read them).
class MetricWindow {
 public:
  // Adds each finite number of `metrics` (an object) to its sum; counts one micro-batch. A value
  // that is null, NaN or infinite is left out, and its micro-batch from that metric's mean.
  void add(const nlohmann::json& metrics);
  // The window's means (empty before any add), then a fresh window. A metric without a finite
  // value in the window is absent.
  nlohmann::json take();
  const std::vector<nlohmann::json>& logged() const { return logged_; }

 private:
  nlohmann::json sums_ = nlohmann::json::object();
  std::map<std::string, int64_t> left_out_;  // per metric: its non-finite values in the window
  int64_t batches_ = 0;
  std::vector<nlohmann::json> logged_;
};

class MetricsLogger {
 public:
  // metrics_path empty = no file. resume=true appends to an existing file after dropping
  // records with step > start_step (written after the checkpoint we resume from).
  MetricsLogger(const std::string& metrics_path, int64_t total_steps, bool resume,
                int64_t start_step);
  ~MetricsLogger();
  // Writes one line (without non-finite numbers); prints progress or a log line.
  void log(const nlohmann::json& record);
  // A line on stderr (or the log sink) that does not break the bar.
  void message(const std::string& text, LogLevel level = LogLevel::kInfo);
  // --report_to tensorboard: every later record also goes to an event file in `dir`
  // (trainers/common/tfevents.h), after a text "args" with the run's options.
  void report_to_tensorboard(const std::string& dir, const std::string& args_json);
  void finish();
  int64_t lost_records() const { return lost_; }

 private:
  void print_progress(const nlohmann::json& r);
  void write_record(const std::string& line);
  std::string path_;
  int fd_ = -1;
  int64_t good_size_ = 0;  // bytes of complete records in the file
  int64_t lost_ = 0;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t tensorboard_lost_ = 0;  // records with a scalar or text that could not be written
  int64_t total_steps_;
  bool tty_;
  bool bar_shown_ = false;
  std::chrono::steady_clock::time_point start_;
  int64_t start_step_;
};

}  // namespace leantune
