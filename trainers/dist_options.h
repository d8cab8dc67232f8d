// The distribution options of every trainer: how ranks talk (engine/comm.h).
//
//   comm_backend        auto | single | mpi | nccl (auto: mpi when started by mpirun/srun with
//                       more than one rank, else single; nccl needs CUDA tensors)
//   deterministic_comm  sums fold the ranks' contributions in rank order, so results do not
//                       depend on the transport's reduction tree
//   comm_timeout        seconds a collective may wait for a peer before the run stops with a
//                       message naming the lost rank (exit 5) and the job is ended
#pragma once

#include "engine/comm.h"
#include "trainers/options.h"

namespace leantune {

void add_dist_options(Options& o);
CommOptions dist_arguments(const Options& o);

}  // namespace leantune
