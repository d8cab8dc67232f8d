// Ring attention over the thread ring of ring_test_util.h, the harness of the ring rows of the
// cross-backend table (tests/backend/table_ring.cpp), checked on the CPU (runs without a
// device): cp 2 over threads equals single-process causal attention over the padded batch at the
// rank's rows, and bf16 on the CPU is refused. And the CUDA ring's refusal of the MPI
// communicator (it moves host tensors), before any message.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kernel_test_util.h"
#include "kernels/ring_test_util.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using ring_test::RankResult;
using Vec = std::vector<double>;

const ring_test::RingCase kShort = {"Short", {1, 7, 0, 33, 18}, 8, 2, 64};

::testing::AssertionResult within(const char* what, const Vec& ours, const Vec& ref, double tol) {
  const double e = kernel_test::max_err(ours, ref);
  const double bound = tol * std::max(1.0, kernel_test::max_abs_finite(ref));
  if (e <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << e << " > " << bound;
}

TEST(RingAttentionThreads, CpuRingOverThreadsMatchesSingleProcess) {
  const ring_test::RingCase& c = kShort;
  const int cp = 2;
  const ring_test::Global g = ring_test::make_global(c, cp, DType::kF64, 99);
  const std::vector<RankResult> ring = ring_test::run_rings(c, g, cp, Device::cpu(), DType::kF64);
  const std::vector<int32_t>& cuv = g.z0.cu_seqlens_global;
  const Tensor cu = Tensor::from_vector(cuv, {static_cast<int64_t>(cuv.size())});
  kernels::AttentionOptions opt;
  Tensor out = Tensor::empty(g.q.shape(), DType::kF64),
         lse = Tensor::empty({c.hq, g.q.size(0)}, DType::kF64);
  kernels::attention_fwd(g.q, g.k, g.v, cu, cu, opt, out, lse);
  Tensor dq = Tensor::empty(g.q.shape(), DType::kF64), dk = Tensor::empty(g.k.shape(), DType::kF64),
         dv = Tensor::empty(g.v.shape(), DType::kF64);
  kernels::attention_bwd(g.dout, g.q, g.k, g.v, out, lse, cu, cu, opt, dq, dk, dv);
  const int64_t rq = c.hq * c.d, rk = c.hk * c.d;
  for (int r = 0; r < cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const kernels::ZigzagLayout z = kernels::zigzag_layout(c.lengths, cp, r);
    EXPECT_TRUE(
        within("out", ring[r].out.to_f64(), ring_test::local_rows(out.to_f64(), rq, z), 1e-12));
    EXPECT_TRUE(
        within("dq", ring[r].dq.to_f64(), ring_test::local_rows(dq.to_f64(), rq, z), 1e-12));
    EXPECT_TRUE(
        within("dk", ring[r].dk.to_f64(), ring_test::local_rows(dk.to_f64(), rk, z), 1e-12));
    EXPECT_TRUE(
        within("dv", ring[r].dv.to_f64(), ring_test::local_rows(dv.to_f64(), rk, z), 1e-12));
  }
  EXPECT_THROW(ring_test::run_rings(c, g, cp, Device::cpu(), DType::kBF16), Error);
}

// The CUDA ring refuses the MPI communicator (it moves host tensors) before any message.
TEST(RingAttentionCudaErrors, CudaTensorsOverMpiAreRefused) {
  LT_SKIP_WITHOUT_CUDA();
  const Device gpu = Device::cuda(0);
  const ring_test::RingCase& c = kShort;
  const kernels::ZigzagLayout z = kernels::zigzag_layout(c.lengths, 2, 0);
  const Tensor q = Tensor::zeros({z.local_rows(), c.hq, c.d}, DType::kF32, gpu);
  const Tensor kv = Tensor::zeros({z.local_rows(), c.hk, c.d}, DType::kF32, gpu);
  struct MpiNamed final : Communicator {
    int rank() const override { return 0; }
    int size() const override { return 2; }
    int local_rank() const override { return 0; }
    std::string backend_name() const override { return "mpi"; }
    bool deterministic() const override { return true; }
    double timeout_seconds() const override { return 1; }
    void all_reduce(Tensor&, ReduceOp) override {}
    void reduce_scatter(const Tensor&, Tensor&, ReduceOp) override {}
    void all_gather(const Tensor&, Tensor&) override {}
    void broadcast(Tensor&, int) override {}
    void group_start() override { ADD_FAILURE() << "a message was posted"; }
    void group_end() override {}
    void send(const Tensor&, int) override {}
    void recv(Tensor&, int) override {}
    void barrier() override {}
    double all_reduce_scalar(double v, ReduceOp) override { return v; }
    int64_t all_reduce_int(int64_t v, ReduceOp) override { return v; }
    std::vector<double> all_gather_scalar(double v) override { return {v}; }
    std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
    std::unique_ptr<Communicator> duplicate(const CommOptions&) override { return nullptr; }
  } mpi;
  EXPECT_THROW(kernels::zigzag_ring_attention_fwd(mpi, q, kv, kv, z), Error);
}

}  // namespace
}  // namespace leantune
