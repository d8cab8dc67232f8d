// The distribution options of every trainer: how ranks talk (engine/comm.h).
//
//   comm_backend        auto | single | mpi | nccl (auto: mpi when started by mpirun/srun with
//                       more than one rank, else single; nccl needs CUDA tensors)
//   deterministic_comm  sums fold the ranks' contributions in rank order, so results do not
//                       depend on the transport's reduction tree
//   comm_timeout        seconds a collective may wait for a peer before the run stops with a
//                       message naming the lost rank (exit 5) and the job is ended
//   zero_stage          0: data parallel (gradients all-reduced, every rank keeps everything);
//                       1: optimizer states and f32 masters sharded; 2: gradients
//                       reduce-scattered as well (dist/zero.h); 3: the parameters
//                       sharded too, a decoder layer gathered for each use (dist/zero3.h)
//   stage3_param_persistence_threshold
//                       stage 3: parameters of at most this many elements stay whole on every
//                       rank (DeepSpeed's name and default)
//   stage3_prefetch_bucket_size
//                       stage 3: elements of the units that follow in the last pass's order
//                       whose gathers start ahead (DeepSpeed's name and default; 0: none)
//   reduce_bucket_size  elements per ZeRO unit: the grain of the reductions, and under stage 2
//                       the most full gradients that exist at once beyond those in flight
//   cp_size             context parallelism: the ranks that split each micro-batch's sequence
//                       dimension (zigzag ring attention, dist/context_parallel.h); the
//                       world size must be a multiple of it; CPU ranks in f32, or CUDA ranks over
//                       --comm_backend nccl (kernels/ring_attention.h)
#pragma once

#include "engine/comm.h"
#include "loaders/option_table.h"

namespace leantune {

struct DistArguments {
  CommOptions comm;
  int zero_stage = 0;
  int64_t reduce_bucket_size = 25'000'000;  // elements per ZeRO unit (DeepSpeed's name)
  int cp_size = 1;                          // context-parallel ranks per micro-batch
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_prefetch_bucket_size = 50'000'000;  // elements gathered ahead (DeepSpeed's)
};

// The communicator's options (part of the dist table).
const OptionTable<CommOptions>& comm_table();
// Every option above (part of the training table).
const OptionTable<DistArguments>& dist_table();
// Error(kInput) for a comm_timeout that is not positive.
void check_dist_arguments(const DistArguments& d);

}  // namespace leantune
