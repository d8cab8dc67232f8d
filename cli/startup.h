// trainer_bin's first step: settings that libraries read only when they load. The OpenMP runtime
// reads OMP_WAIT_POLICY and OpenBLAS reads OPENBLAS_CORETYPE before main runs, so trainer_bin
// sets what it needs (engine/blas_kernels.h chooses the kernels) and executes itself again
// (execv of /proc/self/exe: same pid, argv, open files and signal mask), at most twice: once to
// load the chosen kernels, once more to undo them if they fail their self-check. This runs
// before MPI_Init, so under mpirun each rank restarts before the launcher wires it up.
#pragma once

namespace leantune {

// Returns 0 to go on (after any restart), or the exit code after printing one error line.
int prepare_process(char** argv);

// The run header's BLAS line ("BLAS: OpenBLAS 0.3.21, SkylakeX kernels (...), 2 threads") on
// stdout, for a run on the CPU; nothing for a CUDA run.
void print_blas_header(bool on_cpu);

}  // namespace leantune
