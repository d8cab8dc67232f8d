// trainer_bin: the command-line entry point. Every subcommand's errors are caught here and
// reported as one line on stderr with a distinct exit code (engine/check.h: exit_code()).
#include <cstdio>
#include <exception>
#include <string>

#include "engine/check.h"
#include "trainers/commands.h"

int main(int argc, char** argv) {
  try {
    return leantune::run_command_line(argc, argv);
  } catch (const leantune::Error& e) {
    std::fprintf(stderr, "trainer_bin: %s\n", e.what());
    return leantune::exit_code(e.kind());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "trainer_bin: out of host memory\n");
    return leantune::exit_code(leantune::ErrorKind::kOutOfMemory);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_bin: internal error: %s\n", e.what());
    return 1;
  }
}
