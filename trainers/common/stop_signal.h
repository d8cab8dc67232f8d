// Stop signals (SIGTERM, SIGINT, SIGHUP): a clean stop with a checkpoint instead of a kill, as a
// preemption's grace period needs.
//
// While a StopSignalScope is alive, the first stop signal sets a flag (stop_requested()) that the
// training loop checks between micro-batches, the generation engine between decode steps and a
// reward command's wait at least every second; the run then saves the state of its last
// completed update and returns. A later signal is only counted while a SignalsDeferredScope is
// alive (Trainer::train holds one from its set-up to its final save): it cannot tear the save
// that the first one started. Outside one (while a command loads its data) a second signal ends
// the process with the signal's default action, for a user who does not want to wait.
// Children that run in process groups of their own (reward commands,
// trainers/common/child_process.h) are registered here: that default action first kills their
// groups, so none outlives the trainer.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <exception>

namespace leantune {

// Set by a stop signal while a StopSignalScope is alive, or by request_stop().
bool stop_requested();
// Asks for the stop a first signal asks for (no escalation on repeated calls): for an embedder
// that handles the signals itself (StopSignalScope without handlers). Async-signal-safe: it only
// stores to a lock-free atomic. The outermost StopSignalScope clears the request when it begins.
void request_stop();
// Stop signals received after the first while a SignalsDeferredScope was alive.
int64_t deferred_signals();

// Installs the handlers of SIGTERM, SIGINT and SIGHUP (SIGHUP not where it is ignored, as under
// nohup) for its lifetime; with install_handlers false it leaves every handler as it is, and only
// request_stop() sets the flag. Scopes nest; the outermost one clears the flag.
class StopSignalScope {
 public:
  explicit StopSignalScope(bool install_handlers = true);
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

 private:
  bool installed_;
  void (*prev_[3])(int) = {};
};

// While alive, a stop signal after the first is counted, not fatal. Nests.
class SignalsDeferredScope {
 public:
  SignalsDeferredScope();
  ~SignalsDeferredScope();
  SignalsDeferredScope(const SignalsDeferredScope&) = delete;
  SignalsDeferredScope& operator=(const SignalsDeferredScope&) = delete;
};

// Thrown by a phase that stop_requested() cut short (a generation, a reward command's wait): the
// update under way is abandoned, and the trainer stops at its last completed update.
class StopRequested : public std::exception {
 public:
  const char* what() const noexcept override { return "stopped by a signal"; }
};
// Throws StopRequested when a stop was requested.
void throw_if_stop_requested();

// A child's process group, killed (SIGKILL) when a second signal ends the process. At most 16 at
// once; registering more is an Error(kInternal).
void register_child_group(pid_t pgid);
void unregister_child_group(pid_t pgid);

}  // namespace leantune
