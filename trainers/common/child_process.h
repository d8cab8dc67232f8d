// A child process that the trainer talks to (a reward command): `sh -c COMMAND` with its stdin and
// stdout on one end of a socket pair (stderr inherited), in a process group of its own.
//
// The group is what gets ended, so that nothing the command starts (a pipeline, a script's own
// children) outlives the trainer: end() closes the socket (a well-behaved child exits on end of
// input), sends SIGTERM to the group, SIGKILL kChildGraceSeconds later to whatever is left, and
// reaps the child. The destructor calls it, so every exit path that unwinds ends the group (the
// end of the run, an error, a stop signal); a second stop signal that ends the process at once
// kills the group from the signal handler (trainers/common/stop_signal.h). On Linux the trainer is
// also its descendants' subreaper (an orphan of the command is reparented to it, and reaped by
// end() at once), and the child gets SIGKILL when the trainer is killed outright (PR_SET_PDEATHSIG;
// the command's own children are then left to its handling of that). Its own group also keeps a
// terminal's Ctrl-C, which goes to the foreground group, from reaching the child before the
// trainer has stopped cleanly.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace leantune {

constexpr double kChildGraceSeconds = 2.0;

class ChildProcess {
 public:
  // Error(kInput) naming `what` when the process cannot be started.
  ChildProcess(const std::string& command, const std::string& what);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The trainer's end of the socket pair (non-blocking); -1 after end().
  int fd() const { return fd_; }
  // Waits up to `seconds` for the child to exit by itself; its status as " (exit code N)" or
  // " (killed by signal N)", or nullopt when it is still running.
  std::optional<std::string> wait_exit(double seconds);
  // Ends the process group as described above. Idempotent.
  void end();

 private:
  pid_t pid_ = -1;  // also the process group's id
  int fd_ = -1;
  bool reaped_ = false;
};

}  // namespace leantune
