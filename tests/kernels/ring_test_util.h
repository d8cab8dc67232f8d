// Zigzag ring attention over threads, for tests without MPI or NCCL: ThreadRing, a Communicator
// whose ranks are threads of this process (point-to-point only, moved at group_end), so a ring
// of any size runs on one CPU or one GPU (NCCL refuses two ranks on one device); the padded
// global problem of a set of documents; and the ring forward and backward of every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/comm.h"
#include "engine/tensor.h"
#include "kernels/ring_attention.h"

namespace leantune::ring_test {

// Runs f(rank, comm) on cp threads over one ThreadRing; rethrows the first rank's error.
void run_ring(int cp, const std::function<void(int, Communicator&)>& f);

struct RingCase {
  const char* name;
  std::vector<int64_t> lengths;  // documents
  int64_t hq, hk, d;
};

// The padded global problem (CPU, dtype dt); dout is zero on pad rows, as the loss masks them.
struct Global {
  kernels::ZigzagLayout z0;  // rank 0's layout, for the global cu_seqlens
  Tensor q, k, v, dout;
};
Global make_global(const RingCase& c, int cp, DType dt, uint64_t seed);

// One rank's results, on the host.
struct RankResult {
  Tensor out, lse, dq, dk, dv;
};
// The ring forward and backward of every rank on `dev` in dtype `dt` (inputs converted).
std::vector<RankResult> run_rings(const RingCase& c, const Global& g, int cp, Device dev, DType dt);

// A rank's rows of a global [Tg, ...] host vector whose rows hold `row` values.
std::vector<double> local_rows(const std::vector<double>& global, int64_t row,
                               const kernels::ZigzagLayout& z);

}  // namespace leantune::ring_test
