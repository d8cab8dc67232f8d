// Starting and ending a child process group (see child_process.h).
#include "trainers/common/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/check.h"
#include "trainers/common/stop_signal.h"

namespace leantune {

namespace {

std::string status_text(int st) {
  return WIFEXITED(st) ? " (exit code " + std::to_string(WEXITSTATUS(st)) + ")"
                       : " (killed by signal " + std::to_string(WTERMSIG(st)) + ")";
}

bool group_alive(pid_t pgid) { return ::kill(-pgid, 0) == 0 || errno != ESRCH; }

// Reaps the group's members that have exited (children of this process); whether `leader` was one.
bool reap_group(pid_t pgid, pid_t leader) {
  bool got_leader = false;
  pid_t r;
  while ((r = ::waitpid(-pgid, nullptr, WNOHANG)) > 0) got_leader = got_leader || r == leader;
  return got_leader;
}

}  // namespace

ChildProcess::ChildProcess(const std::string& command, const std::string& what) {
  // A socket pair, not pipes: a write to a child that has exited fails with EPIPE
  // (MSG_NOSIGNAL) instead of raising SIGPIPE in the whole process.
  int sv[2];
  LT_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, what,
           ": socketpair: ", std::strerror(errno));
#ifdef __linux__
  // The command's own children are reparented to this process when their parent exits (not to
  // init, which may reap them late): end() reaps them, and sees their group gone as soon as it is.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    LT_THROW(ErrorKind::kInput, what, ": fork: ", std::strerror(e));
  }
  if (pid == 0) {  // the child: its own group; stdin and stdout on its end of the pair
    ::setpgid(0, 0);
#ifdef __linux__
    // Killed with the trainer's thread that started it: the main thread, which lives as long as
    // the trainer does.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
#endif
    ::dup2(sv[1], 0);
    ::dup2(sv[1], 1);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  (void)parent;
  // Also here, so that the group exists before any signal could be sent to it.
  ::setpgid(pid, pid);
  ::close(sv[1]);
  pid_ = pid;
  fd_ = sv[0];
  register_child_group(pid_);
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

ChildProcess::~ChildProcess() { end(); }

std::optional<std::string> ChildProcess::wait_exit(double seconds) {
  if (pid_ <= 0 || reaped_) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      // The group may still hold the command's own children: end() ends them.
      reaped_ = true;
      return status_text(st);
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void ChildProcess::end() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGTERM);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kChildGraceSeconds);
  while (true) {
    if (reap_group(pid_, pid_)) reaped_ = true;
    if (!group_alive(pid_) || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(-pid_, SIGKILL);
  if (!reaped_) ::waitpid(pid_, nullptr, 0);
  // The members killed just now that are this process's children (reparented, see above).
  while (group_alive(pid_) && ::waitpid(-pid_, nullptr, 0) > 0) {
  }
  unregister_child_group(pid_);
  pid_ = -1;
}

}  // namespace leantune
