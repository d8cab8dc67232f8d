// Exit codes of the error kinds, and the throw helpers behind the check macros (see check.h).
#include "engine/check.h"

#include <cstring>

#ifdef LEANTUNE_WITH_MPI
#include <mpi.h>
#endif

namespace leantune {

int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInput:
      return 2;
    case ErrorKind::kOutOfMemory:
      return 3;
    case ErrorKind::kNonFinite:
      return 4;
    case ErrorKind::kComm:
      return 5;
    case ErrorKind::kInternal:
      return 1;
  }
  return 1;
}

namespace detail {

void throw_error(ErrorKind kind, const char* file, int line, const std::string& msg) {
  // Input errors are read by users: the message already names what is wrong, so the source
  // location goes last and short. Internal errors lead with it.
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  if (kind == ErrorKind::kInput) throw Error(kind, msg);
  throw Error(kind, str_cat(msg, " [", base, ":", line, "]"));
}

std::string mpi_error_string(int code) {
#ifdef LEANTUNE_WITH_MPI
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) == MPI_SUCCESS) return std::string(buf, len);
#endif
  return "MPI error " + std::to_string(code);
}

}  // namespace detail
}  // namespace leantune
