// The distribution options (see dist_options.h).
#include "dist/dist_options.h"

#include "engine/check.h"

namespace leantune {

const OptionTable<CommOptions>& comm_table() {
  using C = CommOptions;
  static const OptionTable<C> t =
      OptionTable<C>()
          .text("comm_backend", &C::backend,
                "how ranks talk: auto (mpi under mpirun/srun with several ranks, else single), "
                "single, mpi (CPU tensors), nccl (CUDA tensors)",
                {"auto", "single", "mpi", "nccl"})
          .flag("deterministic_comm", &C::deterministic,
                "fold the ranks' contributions in rank order (results independent of the "
                "transport's reduction tree)")
          .real("comm_timeout", &C::timeout_seconds,
                "seconds a collective waits for a peer before the run stops naming the lost rank");
  return t;
}

const OptionTable<DistArguments>& dist_table() {
  using D = DistArguments;
  static const OptionTable<D> t =
      OptionTable<D>()
          .nested(&D::comm, comm_table())
          .integer("zero_stage", &D::zero_stage,
                   "ZeRO (DeepSpeed's stages): 0 data parallel, 1 optimizer states sharded, 2 "
                   "gradients sharded too, 3 parameters sharded too (a decoder layer gathered for "
                   "each use)",
                   0, 3)
          .integer("stage3_param_persistence_threshold", &D::stage3_param_persistence_threshold,
                   "zero_stage 3: parameters of at most this many elements stay whole on every "
                   "rank",
                   0)
          .integer("stage3_prefetch_bucket_size", &D::stage3_prefetch_bucket_size,
                   "zero_stage 3: elements of the next units (in the order the last pass used "
                   "them) whose gathers start while the current unit computes; 0 gathers each "
                   "unit on use",
                   0)
          .integer("reduce_bucket_size", &D::reduce_bucket_size,
                   "elements per ZeRO unit (gradients are reduced unit by unit; under stage 2 the "
                   "full gradients of at most about one unit exist at once)",
                   1)
          .integer("cp_size", &D::cp_size,
                   "context parallelism: ranks that split each micro-batch's sequence dimension "
                   "(zigzag ring attention; the world size must be a multiple of it; sft, dpo and "
                   "kto; CPU ranks in f32, or CUDA ranks with --comm_backend nccl)",
                   1);
  return t;
}

void check_dist_arguments(const DistArguments& d) {
  LT_CHECK_INPUT(d.comm.timeout_seconds > 0, "option comm_timeout ", d.comm.timeout_seconds,
                 ": must be a positive number of seconds");
}

}  // namespace leantune
