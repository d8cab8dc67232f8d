// Which OpenBLAS kernel family runs the CPU backend's GEMMs, and how it was chosen.
//
// Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernels when it loads, from a table of CPU models it
// knows. On a newer CPU it falls back to its generic "Prescott" kernels (SSE3), and training runs
// at a fraction of the machine's speed: 3.7x slower on an Emerald Rapids Xeon (Intel family 6,
// model 207) with OpenBLAS 0.3.21. The library reads OPENBLAS_CORETYPE when it loads, so the
// kernels can only be changed by starting the process again with that variable set.
//
// Here: a table of OpenBLAS 0.3.21's x86-64 kernel families with the instruction set each needs,
// the decision (a pure function of the CPU's features, the family running now and the
// environment, so that tests can give it any CPU), trainer_bin's start-up step that sets
// OPENBLAS_CORETYPE and checks the kernels after the restart, and the line that says which
// kernels run ("BLAS: OpenBLAS 0.3.21, SkylakeX kernels (chosen by leantune, self-checked; the
// library detected Prescott), 2 threads").
//
// Environment:
//   OPENBLAS_CORETYPE               the user's choice: always respected, never checked
//   LEANTUNE_BLAS_CORETYPE          auto (default: the best family when the library's is worse),
//                                   library (keep the library's), or a family name below
//   LEANTUNE_BLAS_SIMULATE_DETECTED for tests: with OPENBLAS_CORETYPE set to the same family,
//                                   treat it as the library's own detection
//   LEANTUNE_BLAS_SIMULATE_MISMATCH for tests: the self-check's first GEMM result is perturbed
//   LEANTUNE_BLAS_STATE             set by trainer_bin for its restarted self (and children)
#pragma once

#include <string>
#include <vector>

#include "engine/cpu_features.h"

namespace leantune {

// A kernel family leantune may choose (OPENBLAS_CORETYPE's spelling in OpenBLAS 0.3.21).
struct BlasKernelFamily {
  const char* name;
  bool (*runs_on)(const CpuFeatures&);
};
// Best first: the first entry the CPU runs is the best family for it.
const std::vector<BlasKernelFamily>& blas_kernel_families();

// How capable an OpenBLAS 0.3.21 x86-64 core's kernels are: 1 SSE-class (the generic Prescott
// among them), 2 AVX, 3 AVX2 + FMA (Haswell, Zen), 4 AVX-512 (SkylakeX), 5 AVX-512 + BF16
// (Cooperlake); 0 for a name this table does not know (never second-guessed).
int blas_kernel_tier(const std::string& core);

// The best family for this CPU ("" when none beats the SSE-class kernels).
std::string best_blas_kernels(const CpuFeatures& cpu);

// The variables that steer the choice ("" when unset).
struct BlasEnvironment {
  std::string openblas_coretype;
  std::string leantune_coretype;
  std::string simulate_detected;
  static BlasEnvironment from_process();
};

struct BlasDecision {
  std::string force;     // the family to load (set OPENBLAS_CORETYPE and restart); "" to keep
  std::string detected;  // the library's own choice ("" when the user forced the family)
  bool simulated = false;
  bool by_leantune_option = false;  // force came from LEANTUNE_BLAS_CORETYPE, not from auto
};

// What to do, given the CPU, the family running now (openblas_get_corename()) and the
// environment. Throws Error(kInput) naming the variable for a value it cannot honour.
BlasDecision decide_blas_kernels(const CpuFeatures& cpu, const std::string& running,
                                 const BlasEnvironment& env);

// trainer_bin's start-up step, before any GEMM and before MPI_Init. kToLoadChoice: it set
// OPENBLAS_CORETYPE (and LEANTUNE_BLAS_STATE) and the process must execute itself again to load
// those kernels. In the restarted process it checks the forced kernels against a naive loop
// (blas_self_check.h); when they disagree it restores the library's choice and returns
// kToUndoChoice: the process must execute itself again, once, and must not go on with these
// kernels. Throws Error(kInput) for an environment it cannot honour.
enum class BlasRestart { kNone, kToLoadChoice, kToUndoChoice };
BlasRestart prepare_blas_kernels();
// After kToLoadChoice, when the process could not execute itself: puts the environment back, so
// that the report names the library's kernels as running and the family to set by hand.
void cancel_blas_restart();

// The running kernels and how they were chosen, for the run header and the memory report.
struct BlasReport {
  std::string library;  // "OpenBLAS" ("" with another BLAS)
  std::string version;  // "0.3.21"
  std::string kernels;  // the running family
  std::string origin;   // how it was chosen, in words
  std::string better;   // a family this CPU runs better, when the running one is not it
  int threads = 0;
  std::string line() const;  // "BLAS: OpenBLAS 0.3.21, SkylakeX kernels (...), 2 threads"
};
BlasReport blas_report();

// For hosts that cannot restart (programs embedding libleantune): when the library's kernels are
// worse than this CPU's best, one warning on stderr naming the variable to set. Says nothing in
// trainer_bin, whose start-up step has already dealt with it.
void warn_once_about_blas_kernels();

}  // namespace leantune
