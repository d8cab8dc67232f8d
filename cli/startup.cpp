// See startup.h.
#include "cli/startup.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/blas_kernels.h"
#include "engine/check.h"
#include "engine/gemm_tuning.h"

namespace leantune {

int prepare_process(char** argv) {
  bool restart = false;
  // OpenMP threads that spin while waiting steal the CPU from each other and from whatever else
  // runs on the machine; with one busy core out of two, spinning made training 6x slower than
  // one thread. Unless the user chose a policy, trainer_bin waits passively.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    restart = true;
  }
  BlasRestart blas = BlasRestart::kNone;
  try {
    // A mistyped LEANTUNE_GEMM_AUTOTUNE fails here, not at the first CUDA product after the
    // model has loaded.
    (void)gemm_tuning::mode();
    blas = prepare_blas_kernels();
  } catch (const Error& e) {
    std::fprintf(stderr, "trainer_bin: %s\n", e.what());
    return exit_code(e.kind());
  }
  if (!restart && blas == BlasRestart::kNone) return 0;
  ::execv("/proc/self/exe", argv);
  const int err = errno;
  if (blas == BlasRestart::kToUndoChoice) {
    std::fprintf(stderr,
                 "trainer_bin: the BLAS kernels leantune chose failed their self-check (%s) and "
                 "restarting without them failed (%s): set LEANTUNE_BLAS_CORETYPE=library\n",
                 std::getenv("LEANTUNE_BLAS_SELF_CHECK"), std::strerror(err));
    return exit_code(ErrorKind::kInternal);
  }
  // Without a restart the run goes on as it is; the run header then names the kernels to set.
  if (blas == BlasRestart::kToLoadChoice) cancel_blas_restart();
  return 0;
}

void print_blas_header(bool on_cpu) {
  if (on_cpu) std::printf("%s\n", blas_report().line().c_str());
}

}  // namespace leantune
