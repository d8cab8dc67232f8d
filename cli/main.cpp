// trainer_bin: the command-line entry point. Every subcommand's errors are caught here and
// reported as one line on stderr with a distinct exit code (engine/check.h: exit_code()).
// Under a launcher (mpirun/srun) a rank that fails ends the whole job (abort_communicators), so
// its peers stop at once instead of waiting in their next collective until --comm_timeout.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "cli/commands.h"
#include "cli/startup.h"
#include "engine/check.h"
#include "engine/comm.h"

namespace {

int run(int argc, char** argv) {
  try {
    return leantune::run_command_line(argc, argv);
  } catch (const leantune::Error& e) {
    std::fprintf(stderr, "trainer_bin: %s\n", e.what());
    return leantune::exit_code(e.kind());
  } catch (const std::filesystem::filesystem_error& e) {
    // The user's files and folders (permissions, a full disk), not a bug.
    std::fprintf(stderr, "trainer_bin: %s: %s\n", e.path1().c_str(), e.code().message().c_str());
    return leantune::exit_code(leantune::ErrorKind::kInput);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "trainer_bin: out of host memory\n");
    return leantune::exit_code(leantune::ErrorKind::kOutOfMemory);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_bin: internal error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Settings read when libraries load (OpenMP's wait policy, OpenBLAS's kernels): set, then
  // trainer_bin starts itself again, before anything else runs (cli/startup.h).
  if (const int code = leantune::prepare_process(argv); code != 0) return code;
  // A file-size limit (ulimit -f) must be a failed write that names the file, not a kill.
  std::signal(SIGXFSZ, SIG_IGN);
  const int code = run(argc, argv);
  try {
    if (code != 0 && leantune::world_communicator_started() &&
        leantune::world_communicator().size() > 1) {
      std::fflush(stderr);
      leantune::abort_communicators(code);
    }
    leantune::shutdown_communicators();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_bin: shutting down the communicators: %s\n", e.what());
    return code != 0 ? code : 1;
  }
  return code;
}
