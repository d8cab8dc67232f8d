// The distribution options (see dist_options.h).
#include "trainers/dist_options.h"

#include "engine/check.h"

namespace leantune {

void add_dist_options(Options& o) {
  const CommOptions d;
  o.add_string("comm_backend", d.backend,
               "how ranks talk: auto (mpi under mpirun/srun with several ranks, else single), "
               "single, mpi (CPU tensors), nccl (CUDA tensors)",
               {"auto", "single", "mpi", "nccl"});
  o.add_bool("deterministic_comm", d.deterministic,
             "fold the ranks' contributions in rank order (results independent of the "
             "transport's reduction tree)");
  o.add_float("comm_timeout", d.timeout_seconds,
               "seconds a collective waits for a peer before the run stops naming the lost rank");
}

CommOptions dist_arguments(const Options& o) {
  CommOptions c;
  c.backend = o.get_string("comm_backend");
  c.deterministic = o.get_bool("deterministic_comm");
  c.timeout_seconds = o.get_float("comm_timeout");
  LT_CHECK_INPUT(c.timeout_seconds > 0, "option comm_timeout ", c.timeout_seconds,
                 ": must be a positive number of seconds");
  return c;
}

}  // namespace leantune
