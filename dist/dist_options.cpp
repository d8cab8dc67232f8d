// The distribution options (see dist_options.h).
#include "dist/dist_options.h"

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
  o.add_int("zero_stage", 0,
            "ZeRO (DeepSpeed's stages): 0 data parallel, 1 optimizer states sharded, 2 gradients "
            "sharded too, 3 parameters sharded too (a decoder layer gathered for each use)",
            0, 3);
  o.add_int("stage3_param_persistence_threshold",
            DistArguments{}.stage3_param_persistence_threshold,
            "zero_stage 3: parameters of at most this many elements stay whole on every rank", 0);
  o.add_int("stage3_prefetch_bucket_size", DistArguments{}.stage3_prefetch_bucket_size,
            "zero_stage 3: elements of the next units (in the order the last pass used them) "
            "whose gathers start while the current unit computes; 0 gathers each unit on use",
            0);
  o.add_int("reduce_bucket_size", DistArguments{}.reduce_bucket_size,
            "elements per ZeRO unit (gradients are reduced unit by unit; under stage 2 the full "
            "gradients of at most about one unit exist at once)",
            1);
  o.add_int("cp_size", 1,
            "context parallelism: ranks that split each micro-batch's sequence dimension (zigzag "
            "ring attention; the world size must be a multiple of it; sft, dpo and kto; CPU ranks "
            "in f32, or CUDA ranks with --comm_backend nccl)",
            1);
}

DistArguments dist_arguments(const Options& o) {
  DistArguments d;
  CommOptions& c = d.comm;
  c.backend = o.get_string("comm_backend");
  c.deterministic = o.get_bool("deterministic_comm");
  c.timeout_seconds = o.get_float("comm_timeout");
  LT_CHECK_INPUT(c.timeout_seconds > 0, "option comm_timeout ", c.timeout_seconds,
                 ": must be a positive number of seconds");
  d.zero_stage = static_cast<int>(o.get_int("zero_stage"));
  d.reduce_bucket_size = o.get_int("reduce_bucket_size");
  d.cp_size = static_cast<int>(o.get_int("cp_size"));
  d.stage3_param_persistence_threshold = o.get_int("stage3_param_persistence_threshold");
  d.stage3_prefetch_bucket_size = o.get_int("stage3_prefetch_bucket_size");
  return d;
}

}  // namespace leantune
