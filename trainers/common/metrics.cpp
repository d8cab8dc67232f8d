// metrics.jsonl, the progress line, memory snapshots and metric windows (see metrics.h).
#include "trainers/common/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "engine/check.h"
#include "engine/cuda_api.h"
#include "engine/log.h"
#include "loaders/fs_util.h"
#include "trainers/common/evaluation.h"
#include "trainers/common/tfevents.h"

namespace leantune {

int64_t process_rss_bytes(bool high_water_mark) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  const char* key = high_water_mark ? "VmHWM:" : "VmRSS:";
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, std::strlen(key)) == 0) {
      std::sscanf(line + std::strlen(key), "%lld", &kb);
      break;
    }
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}

nlohmann::json memory_snapshot(Device device) {
  AllocatorStats st = allocator(device).stats();
  nlohmann::json tags = nlohmann::json::object();
  for (int i = 0; i < kNumMemTags; ++i)
    tags[mem_tag_name(static_cast<MemTag>(i))] = {{"current", st.by_tag[i].current},
                                                  {"peak", st.by_tag[i].peak},
                                                  {"at_peak", st.by_tag_at_peak[i]}};
  nlohmann::json j = {{"allocated", st.allocated.current}, {"peak_allocated", st.allocated.peak},
                      {"reserved", st.reserved.current},   {"peak_reserved", st.reserved.peak},
                      {"phase_at_peak", st.phase_at_peak}, {"by_tag", tags}};
  if (device.is_cuda()) {
    size_t free_b = 0, total_b = 0;
    cuda_mem_get_info(device.index, &free_b, &total_b);
    j["device_free"] = free_b;
    j["device_total"] = total_b;
  }
  return j;
}

MetricsLogger::MetricsLogger(const std::string& path, int64_t total_steps, bool resume,
                             int64_t start_step)
    : path_(path),
      total_steps_(total_steps),
      tty_(::isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()),
      start_step_(start_step) {
  if (path.empty()) return;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::string keep;
  if (resume && std::filesystem::exists(path)) {
    // Keep the records up to the checkpoint's step: the resumed run writes the rest again.
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.value("step", int64_t{0}) <= start_step) keep += line + "\n";
      } catch (const nlohmann::json::exception&) {
        // A torn last line from a killed run: dropped.
      }
    }
  }
  // Replaced atomically: a kill here leaves the old file, not a truncated one.
  write_text_atomic(path, keep);
  good_size_ = static_cast<int64_t>(keep.size());
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  LT_CHECK_INPUT(fd_ >= 0, path, ": cannot open for writing: ", std::strerror(errno));
}

MetricsLogger::~MetricsLogger() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLogger::report_to_tensorboard(const std::string& dir, const std::string& args_json) {
  tensorboard_ = std::make_unique<TensorBoardWriter>(dir, TensorBoardWriter::Clock{});
  if (!tensorboard_->text("args", args_json, 0)) ++tensorboard_lost_;
  message("tensorboard: " + tensorboard_->path());
}

void MetricsLogger::write_record(const std::string& line) {
  size_t done = 0;
  int err = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (done == line.size()) {
    good_size_ += static_cast<int64_t>(done);
    return;
  }
  // Cut the partial record; the next one is appended where the last complete one ended.
  const bool cut = done == 0 || ::ftruncate(fd_, good_size_) == 0;
  ++lost_;
  if ((lost_ & (lost_ - 1)) == 0 || !cut)
    message("warning: " + path_ + ": cannot write a metrics record (" + std::strerror(err) + "); " +
                std::to_string(lost_) + " record(s) lost so far" +
                (cut ? "" : "; the last line may be torn (truncation failed)"),
            LogLevel::kWarning);
}

namespace {
// `j` without its non-finite numbers (nlohmann writes them as null), in nested objects too.
nlohmann::json finite_only(const nlohmann::json& j) {
  if (!j.is_object()) return j;
  nlohmann::json out = nlohmann::json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_number_float() && !std::isfinite(it->get<double>())) continue;
    out[it.key()] = finite_only(*it);
  }
  return out;
}
}  // namespace

void MetricsLogger::log(const nlohmann::json& record) {
  const nlohmann::json r = finite_only(record);
  if (fd_ >= 0) write_record(r.dump() + "\n");
  if (tensorboard_ && !tensorboard_->log(r)) {
    // Warned at the first incomplete record and each time the count doubles, as for metrics.
    ++tensorboard_lost_;
    if ((tensorboard_lost_ & (tensorboard_lost_ - 1)) == 0)
      message("warning: " + tensorboard_->path() + ": cannot write an event (" +
                  std::strerror(errno) + "); " + std::to_string(tensorboard_lost_) +
                  " record(s) incomplete so far",
              LogLevel::kWarning);
  }
  print_progress(r);
}

namespace {
std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  return buf;
}
}  // namespace

void MetricsLogger::print_progress(const nlohmann::json& r) {
  // A training record has a learning rate (its loss is absent when every update of the window
  // was skipped as non-finite); anything else is printed as it is.
  if (r.contains("eval_runtime")) {
    message(format_eval_line(r));
    return;
  }
  if (!r.contains("learning_rate")) {
    std::string s = r.dump();
    message(s);
    return;
  }
  const int64_t step = r.value("step", int64_t{0});
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double per_step =
      step > start_step_ ? elapsed / static_cast<double>(step - start_step_) : 0;
  const double eta = per_step * static_cast<double>(total_steps_ - step);
  const double peak = r.contains("memory") ? r["memory"].value("peak_allocated", 0.0) : 0.0;
  char loss[32] = "-", norm[32] = "-";
  if (r.contains("loss")) std::snprintf(loss, sizeof loss, "%.4f", r.value("loss", 0.0));
  if (r.contains("grad_norm")) std::snprintf(norm, sizeof norm, "%.3f", r.value("grad_norm", 0.0));
  // On a GPU of the peak table (engine/device_peaks.h), the model FLOPs utilisation.
  char mfu[32] = "";
  if (r.contains("mfu"))
    std::snprintf(mfu, sizeof mfu, " (MFU %.1f%%)", 100.0 * r.value("mfu", 0.0));
  char line[512];
  std::snprintf(line, sizeof line,
                "step %lld/%lld  loss %s  grad_norm %s  lr %.2e  %.0f tok/s%s  peak %s  ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_steps_), loss, norm,
                r.value("learning_rate", 0.0), r.value("tokens_per_second", 0.0), mfu,
                format_bytes(static_cast<int64_t>(peak)).c_str(), fmt_duration(eta).c_str());
  if (r.contains("rewards/accuracies")) {
    // Preference trainers: TRL's reward metrics after the common ones.
    const size_t used = std::strlen(line);
    std::snprintf(line + used, sizeof line - used,
                  "  rewards/accuracies %.3f  rewards/margins %.4f",
                  r.value("rewards/accuracies", 0.0), r.value("rewards/margins", 0.0));
  }
  if (!log_enabled(LogLevel::kInfo)) return;
  if (tty_ && !log_sink_set()) {
    const int width = 24;
    const int filled = total_steps_ > 0 ? static_cast<int>(width * step / total_steps_) : 0;
    std::string bar(filled, '#');
    bar += std::string(width - filled, '.');
    std::fprintf(stderr, "\r[%s] %s\x1b[K", bar.c_str(), line);
    bar_shown_ = true;
    std::fflush(stderr);
  } else {
    log_message(LogLevel::kInfo, line);
  }
}

void MetricsLogger::message(const std::string& text, LogLevel level) {
  if (bar_shown_ && log_enabled(level)) {
    std::fprintf(stderr, "\n");
    bar_shown_ = false;
  }
  log_message(level, text);
}

void MetricsLogger::finish() {
  if (bar_shown_) std::fprintf(stderr, "\n");
  bar_shown_ = false;
  if (lost_ > 0)
    message("warning: " + path_ + ": " + std::to_string(lost_) +
                " metrics record(s) could not be written and are missing from it",
            LogLevel::kWarning);
  if (tensorboard_lost_ > 0)
    message("warning: " + tensorboard_->path() + ": " + std::to_string(tensorboard_lost_) +
                " record(s) are missing some of their events",
            LogLevel::kWarning);
}

void MetricWindow::add(const nlohmann::json& metrics) {
  for (auto it = metrics.begin(); it != metrics.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (v.is_number() && std::isfinite(v.get<double>()))
      sums_[it.key()] = sums_.value(it.key(), 0.0) + v.get<double>();
    else
      ++left_out_[it.key()];
  }
  ++batches_;
}

nlohmann::json MetricWindow::take() {
  nlohmann::json out = nlohmann::json::object();
  if (batches_ == 0) return out;
  for (auto it = sums_.begin(); it != sums_.end(); ++it) {
    auto skipped = left_out_.find(it.key());
    const int64_t n = batches_ - (skipped == left_out_.end() ? 0 : skipped->second);
    const double mean = it.value().get<double>() / static_cast<double>(n);
    if (std::isfinite(mean)) out[it.key()] = mean;  // a sum of finite values may overflow
  }
  sums_ = nlohmann::json::object();
  left_out_.clear();
  batches_ = 0;
  logged_.push_back(out);
  return out;
}

}  // namespace leantune
