// The one error header. Library code throws leantune::Error; it never exits or aborts.
//
//   LT_CHECK(cond, parts...)        internal invariant or bad argument -> Error (kind kInternal)
//   LT_CHECK_INPUT(cond, parts...)  bad user input or config          -> Error (kind kInput)
//   LT_THROW(kind, parts...)        unconditional
//   CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK / MPI_CHECK(expr)  library return codes, one generator.
//
// Message parts are streamed with operator<<, so LT_CHECK(n > 0, "n=", n, " in ", path) works.
// trainer_bin maps kinds to exit codes (see exit_code()).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace leantune {

enum class ErrorKind {
  kInternal,     // a bug or an unexpected library failure: exit 1
  kInput,        // bad input file, bad option, bad data: exit 2
  kOutOfMemory,  // the caching allocator could not satisfy a request: exit 3
  kNonFinite,    // training stopped after repeated non-finite steps: exit 4
  kComm,         // a peer rank died, stalled past --comm_timeout, or a collective failed: exit 5
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// The process exit code trainer_bin uses for an error of this kind.
int exit_code(ErrorKind kind);

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace leantune

#define LT_THROW(kind, ...)                                 \
  ::leantune::detail::throw_error(kind, __FILE__, __LINE__, \
                                  ::leantune::detail::str_cat(__VA_ARGS__))

#define LT_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      LT_THROW(::leantune::ErrorKind::kInternal, "check failed: " #cond " ", ##__VA_ARGS__); \
  } while (0)

// User-facing: the message alone is what the user sees, so it must name the file/line/option.
#define LT_CHECK_INPUT(cond, ...)                             \
  do {                                                        \
    if (!(cond)) [[unlikely]]                                 \
      LT_THROW(::leantune::ErrorKind::kInput, ##__VA_ARGS__); \
  } while (0)

// A CUDA tensor or CUDA entry point reached in a build without the CUDA backend.
#define LT_THROW_NO_CUDA(op)                                               \
  LT_THROW(::leantune::ErrorKind::kInput, op,                              \
           ": this build of leantune has no CUDA backend (configure with " \
           "-DLEANTUNE_CUDA=ON on a machine with nvcc)")

// One generator for every library's status codes: ok-value, a to-string function, a label.
#define LT_LIB_CHECK_GEN(expr, ok, to_string, label)                                             \
  do {                                                                                           \
    auto _lt_status = (expr);                                                                    \
    if (_lt_status != (ok)) [[unlikely]]                                                         \
      LT_THROW(::leantune::ErrorKind::kInternal, label " error ", static_cast<long>(_lt_status), \
               " (", to_string(_lt_status), ") in ", #expr);                                     \
  } while (0)

#define CUDA_CHECK(expr) LT_LIB_CHECK_GEN(expr, cudaSuccess, cudaGetErrorString, "CUDA")
#define CUBLAS_CHECK(expr) \
  LT_LIB_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, "cuBLAS")
#define NCCL_CHECK(expr) LT_LIB_CHECK_GEN(expr, ncclSuccess, ncclGetErrorString, "NCCL")
#define MPI_CHECK(expr) \
  LT_LIB_CHECK_GEN(expr, MPI_SUCCESS, ::leantune::detail::mpi_error_string, "MPI")
// After every kernel launch.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace leantune::detail {
std::string mpi_error_string(int code);
}
