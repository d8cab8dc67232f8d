// Communicator tests under mpirun (tests/engine/comm.cmake runs this with -np 1, 2 and 4).
//
// Every rank builds its inputs from (rank, index), so every rank can compute the float64
// reference of any collective and the exact rank-order fold that the deterministic mode (and
// every 16-bit reduction) promises. Modes (first argument):
//   collectives  GoogleTest over every collective, both modes, awkward sizes;
//   stuck        rank 1 stops answering; rank 0 must fail with a kComm error naming rank 1
//                within --comm_timeout (2 s here) and end the job;
//   killed       rank 1 dies mid-run; the job must end, non-zero.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/comm.h"
#include "engine/comm_fold.h"
#include "engine/comm_nccl.h"
#include "engine/cuda_backend.h"
#include "engine/dtype.h"
#include "engine/tensor.h"

namespace leantune {
namespace {

Communicator& world() {
  CommOptions o;
  o.backend = "mpi";
  o.timeout_seconds = 120;
  return world_communicator(o);
}

// Values with long mantissas, so that the order of a sum shows in f32.
double value(int rank, int64_t i) {
  return std::sin(0.37 * static_cast<double>(i) + 1.3 * rank) * (1.0 + 0.001 * rank) +
         static_cast<double>((i * 7919 + rank * 104729) % 1000) / 3000.0;
}

Tensor contribution(int rank, int64_t n, DType dtype) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(rank, i);
  return Tensor::from_doubles(v, {n}, dtype);
}

// The rank-order fold of every rank's contribution, computed locally.
Tensor rank_order_fold(int64_t n, DType dtype, int world_size, ReduceOp op) {
  Tensor stacked = Tensor::empty({world_size * n}, dtype);
  for (int r = 0; r < world_size; ++r) {
    Tensor t = contribution(r, n, dtype);
    std::memcpy(static_cast<char*>(stacked.data_ptr()) + r * t.nbytes(), t.data_ptr(), t.nbytes());
  }
  Tensor out = Tensor::empty({n}, dtype);
  comm_detail::fold_rank_order(stacked.data_ptr(), world_size, n, dtype, op, out.data_ptr());
  return out;
}

// Float64 sum of the contributions as stored in dtype.
std::vector<double> reference_sum(int64_t n, DType dtype, int world_size) {
  std::vector<double> ref(n, 0.0);
  for (int r = 0; r < world_size; ++r) {
    const auto c = contribution(r, n, dtype).to_f64();
    for (int64_t i = 0; i < n; ++i) ref[i] += c[i];
  }
  return ref;
}

// Relative tolerance against float64: accumulation in f32 over N terms, or one final rounding.
double tolerance(DType d, int world_size) {
  switch (d) {
    case DType::kF64:
      return 1e-14 * world_size;
    case DType::kF32:
      return 1e-6 * world_size;
    case DType::kBF16:
      return 8e-3;  // 2^-8 final rounding
    default:
      return 1e-3;  // f16: 2^-11 final rounding
  }
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

struct Case {
  DType dtype;
  int64_t n;
  bool deterministic;
};

std::string case_name(const testing::TestParamInfo<Case>& p) {
  return std::string(dtype_name(p.param.dtype)) + "_n" + std::to_string(p.param.n) +
         (p.param.deterministic ? "_deterministic" : "_library");
}

class Collectives : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    CommOptions o;
    o.deterministic = GetParam().deterministic;
    o.timeout_seconds = 120;
    comm_ = world().duplicate(o);
  }
  std::unique_ptr<Communicator> comm_;
};

TEST_P(Collectives, AllReduceSumMatchesFloat64) {
  const Case c = GetParam();
  const int N = comm_->size();
  Tensor x = contribution(comm_->rank(), c.n, c.dtype);
  comm_->all_reduce(x, ReduceOp::kSum);
  const auto got = x.to_f64();
  const auto ref = reference_sum(c.n, c.dtype, N);
  for (int64_t i = 0; i < c.n; ++i) {
    ASSERT_NEAR(got[i], ref[i], tolerance(c.dtype, N) * (1 + std::fabs(ref[i]))) << "at " << i;
  }
  // Deterministic mode, and every 16-bit reduction: the rank-order fold, bit for bit.
  if (c.deterministic || c.dtype == DType::kBF16 || c.dtype == DType::kF16) {
    EXPECT_TRUE(bit_equal(x, rank_order_fold(c.n, c.dtype, N, ReduceOp::kSum)));
  }
}

TEST_P(Collectives, AvgMaxMin) {
  const Case c = GetParam();
  const int N = comm_->size();
  const bool integer = c.dtype == DType::kI64 || c.dtype == DType::kI32;
  for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    if (integer && op == ReduceOp::kAvg) continue;  // refused: avg of integers
    Tensor x = contribution(comm_->rank(), c.n, c.dtype);
    comm_->all_reduce(x, op);
    const auto got = x.to_f64();
    std::vector<std::vector<double>> all;
    for (int r = 0; r < N; ++r) all.push_back(contribution(r, c.n, c.dtype).to_f64());
    for (int64_t i = 0; i < c.n; ++i) {
      double want = all[0][i];
      for (int r = 1; r < N; ++r) {
        if (op == ReduceOp::kMax) want = std::max(want, all[r][i]);
        if (op == ReduceOp::kMin) want = std::min(want, all[r][i]);
        if (op == ReduceOp::kAvg) want += all[r][i];
      }
      if (op == ReduceOp::kAvg) want /= N;
      const double tol = op == ReduceOp::kAvg ? tolerance(c.dtype, N) * (1 + std::fabs(want)) : 0;
      ASSERT_NEAR(got[i], want, tol) << comm_detail::reduce_op_name(op) << " at " << i;
    }
  }
}

TEST_P(Collectives, ReduceScatterKeepsThisRanksBlock) {
  const Case c = GetParam();
  const int N = comm_->size();
  // N blocks of n: block b of rank r holds value(r, b*n + i).
  Tensor in = contribution(comm_->rank(), N * c.n, c.dtype);
  Tensor out = Tensor::empty({c.n}, c.dtype);
  comm_->reduce_scatter(in, out, ReduceOp::kSum);
  const auto ref = reference_sum(N * c.n, c.dtype, N);
  const auto got = out.to_f64();
  for (int64_t i = 0; i < c.n; ++i) {
    const double want = ref[comm_->rank() * c.n + i];
    ASSERT_NEAR(got[i], want, tolerance(c.dtype, N) * (1 + std::fabs(want))) << "at " << i;
  }
  if (c.deterministic || c.dtype == DType::kBF16 || c.dtype == DType::kF16) {
    // Equal to the block of the deterministic all_reduce: one arithmetic for both paths.
    Tensor full = contribution(comm_->rank(), N * c.n, c.dtype);
    comm_->all_reduce(full, ReduceOp::kSum);
    EXPECT_TRUE(bit_equal(out, full.narrow(0, comm_->rank() * c.n, c.n).contiguous()));
  }
}

// out += this rank's block of the sum; deterministic (and 16-bit): the fold starts from out's
// old value, ahead of rank 0's block, which is what makes micro-batch-wise gradient sums over N
// ranks equal one process's running sum.
TEST_P(Collectives, ReduceScatterAccumulateFoldsTheOldValueFirst) {
  const Case c = GetParam();
  if (c.dtype == DType::kI64 || c.dtype == DType::kI32) return;  // gradients are floating
  const int N = comm_->size(), me = comm_->rank();
  Tensor in = contribution(me, N * c.n, c.dtype);
  Tensor old = contribution(me + 11, c.n, c.dtype);
  Tensor out = old.clone();
  comm_->reduce_scatter_accumulate(in, out);
  const auto ref = reference_sum(N * c.n, c.dtype, N);
  const auto start = old.to_f64(), got = out.to_f64();
  for (int64_t i = 0; i < c.n; ++i) {
    const double want = start[i] + ref[me * c.n + i];
    ASSERT_NEAR(got[i], want, tolerance(c.dtype, N + 1) * (1 + std::fabs(want))) << "at " << i;
  }
  if (c.deterministic || c.dtype == DType::kBF16 || c.dtype == DType::kF16) {
    // Rows: the old value, then every rank's block `me`, folded locally.
    const size_t esz = dtype_size(c.dtype);
    Tensor rows = Tensor::empty({(N + 1) * c.n}, c.dtype);
    char* dst = static_cast<char*>(rows.data_ptr());
    std::memcpy(dst, old.data_ptr(), c.n * esz);
    for (int r = 0; r < N; ++r) {
      Tensor block = contribution(r, N * c.n, c.dtype).narrow(0, me * c.n, c.n).contiguous();
      std::memcpy(dst + (r + 1) * c.n * esz, block.data_ptr(), c.n * esz);
    }
    Tensor want = Tensor::empty({c.n}, c.dtype);
    comm_detail::fold_rank_order(rows.data_ptr(), N + 1, c.n, c.dtype, ReduceOp::kSum,
                                 want.data_ptr());
    EXPECT_TRUE(bit_equal(out, want));
  }
}

TEST_P(Collectives, AllGatherAndBroadcast) {
  const Case c = GetParam();
  const int N = comm_->size();
  Tensor in = contribution(comm_->rank(), c.n, c.dtype);
  Tensor out = Tensor::empty({N * c.n}, c.dtype);
  comm_->all_gather(in, out);
  for (int r = 0; r < N; ++r)
    EXPECT_TRUE(bit_equal(out.narrow(0, r * c.n, c.n).contiguous(), contribution(r, c.n, c.dtype)))
        << "block of rank " << r;
  const int root = N - 1;
  Tensor b = contribution(comm_->rank(), c.n, c.dtype);
  comm_->broadcast(b, root);
  EXPECT_TRUE(bit_equal(b, contribution(root, c.n, c.dtype)));
}

INSTANTIATE_TEST_SUITE_P(Sizes, Collectives,
                         testing::Values(Case{DType::kF32, 1, false}, Case{DType::kF32, 19, false},
                                         Case{DType::kF32, 71 * 229, false},
                                         Case{DType::kF32, 71 * 229, true},
                                         Case{DType::kF32, 19, true}, Case{DType::kF64, 19, false},
                                         Case{DType::kF64, 1, true}, Case{DType::kBF16, 1, false},
                                         Case{DType::kBF16, 71 * 229, false},
                                         Case{DType::kF16, 19, true}, Case{DType::kI64, 19, false},
                                         Case{DType::kI32, 71, true}),
                         case_name);

TEST(CommMpi, RanksScalarsAndBarrier) {
  Communicator& w = world();
  EXPECT_EQ(w.backend_name(), "mpi");
  EXPECT_EQ(w.local_rank(), w.rank());  // one node here
  const auto all = w.all_gather_scalar(static_cast<double>(w.rank()) + 0.5);
  ASSERT_EQ(static_cast<int>(all.size()), w.size());
  for (int r = 0; r < w.size(); ++r) EXPECT_EQ(all[r], r + 0.5);
  // Host scalars fold in rank order: 0.1 + 0.2 + 0.3 ... exactly as a loop on one rank.
  double want = 0;
  for (int r = 0; r < w.size(); ++r) want = r == 0 ? 0.1 * (r + 1) : want + 0.1 * (r + 1);
  EXPECT_EQ(w.all_reduce_scalar(0.1 * (w.rank() + 1)), want);
  EXPECT_EQ(w.all_reduce_int(w.rank() + 1), int64_t{w.size()} * (w.size() + 1) / 2);
  EXPECT_EQ(w.all_reduce_int(w.rank(), ReduceOp::kMax), w.size() - 1);
  w.barrier();
}

TEST(CommMpi, RingSendRecvInAGroup) {
  Communicator& w = world();
  const int N = w.size(), r = w.rank();
  for (int64_t n : {int64_t{1}, int64_t{19}, int64_t{71 * 229}}) {
    Tensor mine = contribution(r, n, DType::kBF16);
    Tensor got = Tensor::empty({n}, DType::kBF16);
    w.group_start();
    w.send(mine, (r + 1) % N);
    w.recv(got, (r + N - 1) % N);
    w.group_end();
    EXPECT_TRUE(bit_equal(got, contribution((r + N - 1) % N, n, DType::kBF16))) << "n=" << n;
  }
}

TEST(CommMpi, SplitIntoSubGroups) {
  Communicator& w = world();
  // Two groups by parity, ordered by descending rank.
  auto sub = w.split(w.rank() % 2, -w.rank());
  int expected_size = 0;
  for (int r = 0; r < w.size(); ++r) expected_size += r % 2 == w.rank() % 2;
  ASSERT_EQ(sub->size(), expected_size);
  int expected_rank = 0;
  for (int r = w.rank() + 1; r < w.size(); ++r) expected_rank += r % 2 == w.rank() % 2;
  EXPECT_EQ(sub->rank(), expected_rank);
  Tensor x = Tensor::from_doubles({static_cast<double>(w.rank())}, {1}, DType::kF64);
  sub->all_reduce(x);
  double want = 0;
  for (int r = 0; r < w.size(); ++r)
    if (r % 2 == w.rank() % 2) want += r;
  EXPECT_EQ(x.item(), want);
}

TEST(CommMpi, CpuOnlyAndContiguousAreChecked) {
  Communicator& w = world();
  Tensor m = Tensor::zeros({4, 6}, DType::kF32);
  Tensor strided = m.transpose(0, 1);
  EXPECT_THROW(w.all_reduce(strided), Error);
  Tensor out = Tensor::empty({3}, DType::kF32);
  Tensor in = Tensor::zeros({3 * w.size() + 1}, DType::kF32);
  EXPECT_THROW(w.reduce_scatter(in, out), Error);
}

// Quantized weights (ZeRO-3 of a QLoRA base: u8 packed NF4, i8 rows) move bit for bit through
// all_gather, broadcast and send/recv; the reductions refuse them.
TEST(CommMpi, BytesMoveButDoNotReduce) {
  Communicator& w = world();
  const int N = w.size(), r = w.rank();
  auto bytes = [](int rank, int64_t n, DType dt) {
    Tensor t = Tensor::empty({n}, dt);
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((i * 37 + rank * 101) & 0xff);
    return t;
  };
  for (DType dt : {DType::kU8, DType::kI8}) {
    for (int64_t n : {int64_t{1}, int64_t{19}, int64_t{71 * 229}}) {
      Tensor out = Tensor::empty({N * n}, dt);
      w.all_gather(bytes(r, n, dt), out);
      for (int q = 0; q < N; ++q)
        EXPECT_TRUE(bit_equal(out.narrow(0, q * n, n).contiguous(), bytes(q, n, dt))) << q;
      Tensor b = bytes(r, n, dt);
      w.broadcast(b, N - 1);
      EXPECT_TRUE(bit_equal(b, bytes(N - 1, n, dt)));
      Tensor got = Tensor::empty({n}, dt);
      w.group_start();
      w.send(bytes(r, n, dt), (r + 1) % N);
      w.recv(got, (r + N - 1) % N);
      w.group_end();
      EXPECT_TRUE(bit_equal(got, bytes((r + N - 1) % N, n, dt)));
    }
    Tensor x = bytes(r, 4 * N, dt), part = Tensor::empty({4}, dt);
    EXPECT_THROW(w.all_reduce(x), Error);
    EXPECT_THROW(w.reduce_scatter(x, part), Error);
  }
}

// The NCCL backend (gpu tier, one GPU per rank) against the MPI one on the same inputs: the
// library reductions within the dtype's tolerance; the deterministic ones bit for bit (both fold
// in rank order in f32/f64).
TEST(CommNcclCuda, MatchesTheMpiBackend) {
  Communicator& w = world();
  const int devices = cuda_backend_device_count();
  if (devices < w.size()) GTEST_SKIP() << devices << " CUDA devices for " << w.size() << " ranks";
  for (bool det : {false, true}) {
    CommOptions o;
    o.deterministic = det;
    o.timeout_seconds = 120;
    auto mpi = w.duplicate(o);
    auto nccl = comm_detail::make_nccl_communicator(w.duplicate(o), w.local_rank(), o);
    const Device dev = Device::cuda(w.local_rank());
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (int64_t n : {int64_t{1}, int64_t{19}, int64_t{71 * 229}}) {
        const int N = w.size();
        Tensor host = contribution(w.rank(), N * n, dt);
        Tensor want = host.clone();
        mpi->all_reduce(want);
        Tensor x = host.to(dev);
        nccl->all_reduce(x);
        Tensor got = x.to(Device::cpu());
        const auto a = got.to_f64(), b = want.to_f64();
        for (int64_t i = 0; i < N * n; ++i)
          ASSERT_NEAR(a[i], b[i], tolerance(dt, N) * (1 + std::fabs(b[i]))) << "all_reduce " << i;
        if (det) {
          EXPECT_TRUE(bit_equal(got, want)) << "deterministic all_reduce";
        }
        // Deferred: the consumer queued on the communicator's stream, ordered by wait_deferred.
        Tensor xd = host.to(dev), copied = Tensor::empty(host.shape(), dt, dev);
        nccl->all_reduce_then(xd, ReduceOp::kSum, [&] { copied.copy_(xd); });
        nccl->wait_deferred();
        EXPECT_TRUE(bit_equal(copied.to(Device::cpu()), got)) << "all_reduce_then";
        Tensor rs_want = Tensor::empty({n}, dt);
        mpi->reduce_scatter(host, rs_want);
        Tensor rs = Tensor::empty({n}, dt, dev);
        Tensor hd = host.to(dev);
        nccl->reduce_scatter(hd, rs);
        Tensor rs_got = rs.to(Device::cpu());
        if (det) {
          EXPECT_TRUE(bit_equal(rs_got, rs_want)) << "deterministic reduce_scatter";
        }
        Tensor rsd = Tensor::empty({n}, dt, dev);
        nccl->reduce_scatter_then(hd, rsd, ReduceOp::kSum, [] {});
        nccl->wait_deferred();
        EXPECT_TRUE(bit_equal(rsd.to(Device::cpu()), rs_got)) << "reduce_scatter_then";
        Tensor acc_want = contribution(w.rank() + 11, n, dt);
        mpi->reduce_scatter_accumulate(host, acc_want);
        Tensor acc = contribution(w.rank() + 11, n, dt).to(dev);
        nccl->reduce_scatter_accumulate(hd, acc);
        const auto acc_got = acc.to(Device::cpu());
        if (det) {
          EXPECT_TRUE(bit_equal(acc_got, acc_want)) << "deterministic reduce_scatter_accumulate";
        } else {
          const auto g = acc_got.to_f64(), h = acc_want.to_f64();
          for (int64_t i = 0; i < n; ++i)
            ASSERT_NEAR(g[i], h[i], tolerance(dt, N + 1) * (1 + std::fabs(h[i])))
                << "reduce_scatter_accumulate " << i;
        }
        Tensor ag = Tensor::empty({N * n}, dt, dev);
        Tensor mine = contribution(w.rank(), n, dt).to(dev);
        nccl->all_gather(mine, ag);
        Tensor ag_want = Tensor::empty({N * n}, dt);
        mpi->all_gather(contribution(w.rank(), n, dt), ag_want);
        EXPECT_TRUE(bit_equal(ag.to(Device::cpu()), ag_want)) << "all_gather";
      }
    }
    nccl->barrier();
  }
}

// Rank 1 stops answering (alive, but never reaching the collective: a deadlock, a hung file
// system) or dies; every other rank must fail with a kComm error within the timeout.
int failure_mode(bool killed) {
  CommOptions o;
  o.backend = "mpi";
  o.timeout_seconds = 2;
  Communicator& w = world_communicator(o);
  Tensor x = Tensor::zeros({16}, DType::kF32);
  w.all_reduce(x);  // everyone is here once
  if (w.rank() == 1) {
    if (killed) std::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(300));
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    w.all_reduce(x);
  } catch (const Error& e) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "rank %d after %.1f s: %s\n", w.rank(), s, e.what());
    std::fflush(stderr);
    abort_communicators(exit_code(e.kind()));
    return exit_code(e.kind());
  }
  std::fprintf(stderr, "rank %d: the collective completed without rank 1\n", w.rank());
  return 1;
}

}  // namespace
}  // namespace leantune

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  if (mode == "stuck" || mode == "killed") return leantune::failure_mode(mode == "killed");
  testing::InitGoogleTest(&argc, argv);
  (void)leantune::world();
  const int rc = RUN_ALL_TESTS();
  // Every rank's verdict decides the run: a failure anywhere fails all.
  const int64_t failed = leantune::world().all_reduce_int(rc != 0 ? 1 : 0);
  leantune::shutdown_communicators();
  return failed != 0 ? 1 : 0;
}
