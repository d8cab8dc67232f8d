// The process's log destination (engine/log.h): one sink and one minimum level, behind a mutex.
#include "engine/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "engine/enum_names.h"

namespace leantune {
namespace {

std::mutex g_mutex;
LogSink g_sink;  // empty: stderr
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<bool> g_sink_set{false};

}  // namespace

const char* log_level_name(LogLevel level) {
  static constexpr const char* kNames[] = {"debug", "info", "warning", "error"};
  static_assert(std::size(kNames) == static_cast<size_t>(LogLevel::kError) + 1);
  return enum_name(level, kNames, "?");
}

void set_log_sink(LogSink sink, LogLevel min_level) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sink_set.store(static_cast<bool>(sink));
  g_sink = std::move(sink);
  g_min_level.store(static_cast<int>(min_level));
}

bool log_sink_set() { return g_sink_set.load(); }

bool log_enabled(LogLevel level) { return static_cast<int>(level) >= g_min_level.load(); }

void log_message(LogLevel level, const std::string& text) {
  if (!log_enabled(level)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sink) {
    g_sink(level, text);
    return;
  }
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

}  // namespace leantune
