// The stop-signal flag, its handlers and the children's process groups (see stop_signal.h). The
// handler only touches lock-free atomics and calls async-signal-safe functions (kill, signal,
// raise).
#include "trainers/common/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <csignal>

#include "engine/check.h"

namespace leantune {

namespace {

constexpr int kSignals[3] = {SIGTERM, SIGINT, SIGHUP};
constexpr int kMaxChildGroups = 16;

std::atomic<bool> g_stop{false};
std::atomic<int> g_scopes{0};
std::atomic<int> g_deferring{0};
std::atomic<int64_t> g_deferred{0};
std::atomic<pid_t> g_child_groups[kMaxChildGroups];

void on_signal(int sig) {
  if (!g_stop.exchange(true)) return;  // the first: a clean stop
  if (g_deferring.load() > 0) {
    g_deferred.fetch_add(1);
    return;
  }
  for (auto& g : g_child_groups) {
    const pid_t pgid = g.load();
    if (pgid > 0) ::kill(-pgid, SIGKILL);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

bool stop_requested() { return g_stop.load(); }

static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");
void request_stop() { g_stop.store(true); }

int64_t deferred_signals() { return g_deferred.load(); }

void throw_if_stop_requested() {
  if (stop_requested()) throw StopRequested();
}

StopSignalScope::StopSignalScope(bool install_handlers) : installed_(install_handlers) {
  // Only the outermost scope starts afresh: a signal received while the data was loading still
  // counts once training begins.
  if (g_scopes.fetch_add(1) == 0) {
    g_stop.store(false);
    g_deferred.store(0);
  }
  if (!installed_) return;
  for (int i = 0; i < 3; ++i) {
    prev_[i] = std::signal(kSignals[i], on_signal);
    // Under nohup a hangup stays ignored.
    if (kSignals[i] == SIGHUP && prev_[i] == SIG_IGN) std::signal(SIGHUP, SIG_IGN);
  }
}

StopSignalScope::~StopSignalScope() {
  if (installed_)
    for (int i = 0; i < 3; ++i) std::signal(kSignals[i], prev_[i]);
  g_scopes.fetch_sub(1);
}

SignalsDeferredScope::SignalsDeferredScope() { g_deferring.fetch_add(1); }

SignalsDeferredScope::~SignalsDeferredScope() { g_deferring.fetch_sub(1); }

void register_child_group(pid_t pgid) {
  for (auto& g : g_child_groups) {
    pid_t free_slot = 0;
    if (g.compare_exchange_strong(free_slot, pgid)) return;
  }
  LT_THROW(ErrorKind::kInternal, "more than ", kMaxChildGroups, " child process groups at once");
}

void unregister_child_group(pid_t pgid) {
  for (auto& g : g_child_groups) {
    pid_t mine = pgid;
    if (g.compare_exchange_strong(mine, 0)) return;
  }
}

}  // namespace leantune
