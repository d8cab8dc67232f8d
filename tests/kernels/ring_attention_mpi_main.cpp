// Zigzag ring attention (kernels/ring_attention.h) under mpirun -np cp (tests/kernels/
// ring_attention.cmake runs it with 1, 2 and 4 ranks): every rank builds the same padded global
// q/k/v/dout, runs the ring forward and backward on its zigzag rows, and compares out, lse, dq,
// dk and dv with single-process causal varlen attention over the whole padded batch
// (kernels/attention.h, forward and backward), restricted to the rank's rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "engine/comm.h"
#include "kernels/ring_attention.h"
#include "testing/functional.h"

namespace leantune::kernels {
namespace {

Tensor global_input(int64_t rows, int64_t heads, int64_t dim, double seed, DType dt) {
  std::vector<double> v(rows * heads * dim);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + seed);
  return Tensor::from_doubles(v, {rows, heads, dim}, dt);
}

std::unique_ptr<Communicator> test_comm() {
  CommOptions o;
  o.backend = "mpi";
  o.timeout_seconds = 120;
  return world_communicator(o).duplicate(o);
}

struct Case {
  const char* name;
  std::vector<int64_t> lengths;
  int64_t hq, hk, d;
  double scale;  // 0 = 1/sqrt(d)
};

// The batch (cu_seqlens [0, 128, 1248, 4240]: every length a multiple of 8, so no pads
// up to cp 4) and awkward lengths with an empty document, GQA and an explicit scale (pads at
// every cp > 1).
const Case kCases[] = {
    {"Issue4240", {128, 1120, 2992}, 2, 1, 16, 0.0},
    {"Awkward", {1, 19, 0, 71, 2}, 4, 2, 8, 0.6},
};

// The global problem and its single-process reference, and this rank's view of it.
struct Problem {
  ZigzagLayout z;
  Tensor q, k, v, dout;         // global, padded
  Tensor out, lse, dq, dk, dv;  // the truth: float64 attention on the same (rounded) inputs
  // The single-process attention in the inputs' dtype (equal to the truth for f64), the
  // "naive version" of flash-attention's rule for f32.
  Tensor s_out, s_lse, s_dq, s_dk, s_dv;
};

// Single-process attention forward and backward over the global batch in q's dtype.
void single_process(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                    const Tensor& cu, const AttentionOptions& opt, Tensor* out, Tensor* lse,
                    Tensor* dq, Tensor* dk, Tensor* dv) {
  const DType dt = q.dtype();
  *out = Tensor::empty(q.shape(), dt);
  *lse = Tensor::empty({q.size(1), q.size(0)}, dt);
  attention_fwd(q, k, v, cu, cu, opt, *out, *lse);
  *dq = Tensor::empty(q.shape(), dt);
  *dk = Tensor::empty(k.shape(), dt);
  *dv = Tensor::empty(v.shape(), dt);
  attention_bwd(dout, q, k, v, *out, *lse, cu, cu, opt, *dq, *dk, *dv);
}

Problem make_problem(const Case& c, int cp, int rank, DType dt) {
  Problem p;
  p.z = zigzag_layout(c.lengths, cp, rank);
  const int64_t Tg = p.z.cu_seqlens_global.back();
  p.q = global_input(Tg, c.hq, c.d, 0.1, dt);
  p.k = global_input(Tg, c.hk, c.d, 1.7, dt);
  p.v = global_input(Tg, c.hk, c.d, 2.9, dt);
  // dout is zero on pad rows, as the loss masks them.
  std::vector<double> g = global_input(Tg, c.hq, c.d, 4.3, dt).to_f64();
  for (size_t b = 0; b < c.lengths.size(); ++b)
    for (int64_t i = p.z.cu_seqlens_global[b] + c.lengths[b]; i < p.z.cu_seqlens_global[b + 1]; ++i)
      std::fill(g.begin() + i * c.hq * c.d, g.begin() + (i + 1) * c.hq * c.d, 0.0);
  p.dout = Tensor::from_doubles(g, {Tg, c.hq, c.d}, dt);
  Tensor cu = Tensor::from_vector(p.z.cu_seqlens_global,
                                  {static_cast<int64_t>(p.z.cu_seqlens_global.size())});
  AttentionOptions opt;
  opt.scale = c.scale;
  single_process(p.q.to(DType::kF64), p.k.to(DType::kF64), p.v.to(DType::kF64),
                 p.dout.to(DType::kF64), cu, opt, &p.out, &p.lse, &p.dq, &p.dk, &p.dv);
  if (dt == DType::kF64) {
    p.s_out = p.out, p.s_lse = p.lse, p.s_dq = p.dq, p.s_dk = p.dk, p.s_dv = p.dv;
  } else {
    single_process(p.q, p.k, p.v, p.dout, cu, opt, &p.s_out, &p.s_lse, &p.s_dq, &p.s_dk, &p.s_dv);
  }
  return p;
}

// Largest |got - want| / max(1, |want|) over the rank's rows of a global [Tg, ...] reference.
double max_row_error(const Tensor& got, const Tensor& want_global, const ZigzagLayout& z) {
  std::vector<double> a = got.to_f64(), b = zigzag_local_rows(want_global, z).to_f64();
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    e = std::max(e, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return e;
}

// got: the rank's [H, T] lse, or with got_global a global [H, Tg] one read at the rank's rows.
double max_lse_error(const Tensor& got, const Tensor& want_global, const ZigzagLayout& z,
                     bool got_global = false) {
  const int64_t H = got.size(0), T = z.local_rows(), Tg = want_global.size(1);
  std::vector<double> a = got.to_f64(), b = want_global.to_f64();
  double e = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const double x = got_global ? a[h * Tg + z.global_rows[i]] : a[h * T + i];
      const double y = b[h * Tg + z.global_rows[i]];
      e = std::max(e, std::isinf(y) && x == y ? 0.0 : std::abs(x - y) / std::max(1.0, std::abs(y)));
    }
  return e;
}

// Pad rows of a local [T, H, D] gradient are exactly zero.
void expect_zero_pads(const Tensor& g, const ZigzagLayout& z, const char* what) {
  std::vector<double> a = g.to_f64();
  const int64_t row = g.numel() / g.size(0);
  for (int64_t i = 0; i < z.local_rows(); ++i) {
    if (!z.is_pad[i]) continue;
    for (int64_t e = 0; e < row; ++e) ASSERT_EQ(a[i * row + e], 0.0) << what << " row " << i;
  }
}

class ZigzagRing : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(ZigzagRing, ForwardAndBackwardMatchSingleProcessAttention) {
  auto comm = test_comm();
  const Case& c = kCases[std::get<0>(GetParam())];
  const DType dt = std::get<1>(GetParam());
  Problem p = make_problem(c, comm->size(), comm->rank(), dt);
  const ZigzagLayout& z = p.z;
  const Tensor q = zigzag_local_rows(p.q, z), k = zigzag_local_rows(p.k, z),
               v = zigzag_local_rows(p.v, z), dout = zigzag_local_rows(p.dout, z);
  AttentionOutput got = zigzag_ring_attention_fwd(*comm, q, k, v, z, c.scale);
  AttentionGrads g = zigzag_ring_attention_bwd(*comm, q, k, v, got.out, got.lse, dout, z, c.scale);
  // Errors are relative to max(1, |truth|): lse (~8 here) and the dK/dV of early keys (sums
  // over ~3000 query rows) exceed 1, where 1e-6 absolute would be below one f32 ulp. The truth is
  // float64 attention on the same rounded inputs; in f32 the ring must be within 1e-6 of it, or
  // (flash-attention's rule) within twice the single-process f32 attention's own error.
  const double err_out = max_row_error(got.out, p.out, z),
               err_lse = max_lse_error(got.lse, p.lse, z);
  const double err_dq = max_row_error(g.dq, p.dq, z), err_dk = max_row_error(g.dk, p.dk, z),
               err_dv = max_row_error(g.dv, p.dv, z);
  auto tol = [&](double single_err) {
    return dt == DType::kF64 ? 1e-12 : std::max(1e-6, 2 * single_err);
  };
  const double s_out = max_row_error(zigzag_local_rows(p.s_out, z), p.out, z),
               s_lse = max_lse_error(p.s_lse, p.lse, z, true),
               s_dq = max_row_error(zigzag_local_rows(p.s_dq, z), p.dq, z),
               s_dk = max_row_error(zigzag_local_rows(p.s_dk, z), p.dk, z),
               s_dv = max_row_error(zigzag_local_rows(p.s_dv, z), p.dv, z);
  std::printf(
      "[rank %d/%d %s %s] max rel err out %.3g lse %.3g dq %.3g dk %.3g dv %.3g "
      "(single-process: %.3g %.3g %.3g %.3g %.3g)\n",
      z.rank, z.cp, c.name, dtype_name(dt), err_out, err_lse, err_dq, err_dk, err_dv, s_out, s_lse,
      s_dq, s_dk, s_dv);
  EXPECT_LE(err_out, tol(s_out));
  EXPECT_LE(err_lse, tol(s_lse));
  EXPECT_LE(err_dq, tol(s_dq));
  EXPECT_LE(err_dk, tol(s_dk));
  EXPECT_LE(err_dv, tol(s_dv));
  expect_zero_pads(g.dq, z, "dq");
  expect_zero_pads(g.dk, z, "dk");
  expect_zero_pads(g.dv, z, "dv");
}

// loss = sum(out * w) through the autograd entry: q/k/v grads are the raw backward's with
// dout = w, and the forward is the raw forward's.
TEST_P(ZigzagRing, AutogradMatchesRawBackward) {
  auto comm = test_comm();
  const Case& c = kCases[std::get<0>(GetParam())];
  const DType dt = std::get<1>(GetParam());
  Problem p = make_problem(c, comm->size(), comm->rank(), dt);
  const ZigzagLayout& z = p.z;
  Tensor q = zigzag_local_rows(p.q, z), k = zigzag_local_rows(p.k, z),
         v = zigzag_local_rows(p.v, z);
  const Tensor w = zigzag_local_rows(p.dout, z);
  q.set_requires_grad(true);
  k.set_requires_grad(true);
  v.set_requires_grad(true);
  AttentionOutput r = zigzag_ring_attention(*comm, q, k, v, z, c.scale);
  fn::sum(fn::mul(r.out, w)).backward();
  AttentionOutput raw =
      zigzag_ring_attention_fwd(*comm, q.detach(), k.detach(), v.detach(), z, c.scale);
  AttentionGrads g = zigzag_ring_attention_bwd(*comm, q.detach(), k.detach(), v.detach(), raw.out,
                                               raw.lse, w, z, c.scale);
  EXPECT_EQ(r.out.to_f64(), raw.out.to_f64());
  EXPECT_EQ(q.grad().to_f64(), g.dq.to_f64());
  EXPECT_EQ(k.grad().to_f64(), g.dk.to_f64());
  EXPECT_EQ(v.grad().to_f64(), g.dv.to_f64());
  const double single = max_row_error(zigzag_local_rows(p.s_dq, z), p.dq, z);
  EXPECT_LE(max_row_error(q.grad(), p.dq, z),
            dt == DType::kF64 ? 1e-12 : std::max(1e-6, 2 * single));
}

// Mismatched inputs are a leantune::Error on every rank before any message is sent, so no rank
// waits on a peer that gave up.
TEST(ZigzagRingErrors, BadShapesAndLayoutsThrowBeforeTheRing) {
  auto comm = test_comm();
  const int cp = comm->size(), r = comm->rank();
  const ZigzagLayout z = zigzag_layout({19, 71}, cp, r);
  const int64_t T = z.local_rows();
  const Tensor q = Tensor::zeros({T, 4, 8}, DType::kF32),
               kv = Tensor::zeros({T, 2, 8}, DType::kF32);
  const ZigzagLayout other = zigzag_layout({19, 71}, cp + 1, r);
  EXPECT_THROW(zigzag_ring_attention_fwd(*comm, q, kv, kv, other), Error);
  EXPECT_THROW(zigzag_ring_attention_fwd(*comm, q.narrow(0, 0, T - 1), kv, kv, z), Error);
  EXPECT_THROW(zigzag_ring_attention_fwd(*comm, q.to(DType::kBF16), kv, kv, z), Error);
  const Tensor bad_lse = Tensor::zeros({4, T + 1}, DType::kF32);
  EXPECT_THROW(zigzag_ring_attention_bwd(*comm, q, kv, kv, q, bad_lse, q, z), Error);
  // The ring still works afterwards.
  AttentionOutput res = zigzag_ring_attention_fwd(*comm, q, kv, kv, z);
  EXPECT_EQ(res.out.to_f64(), std::vector<double>(q.numel(), 0.0));
}

// The layout by hand: cp 2, documents of 1 and 19 tokens padded to 4 and 20 (chunks of 1 and
// 5); rank 0 holds chunks 0 and 3 of each, rank 1 chunks 1 and 2.
TEST(ZigzagLayoutTest, ChunksPositionsAndPads) {
  ZigzagLayout z0 = zigzag_layout({1, 19}, 2, 0);
  EXPECT_EQ(z0.padded_lengths, (std::vector<int64_t>{4, 20}));
  EXPECT_EQ(z0.cu_seqlens_global, (std::vector<int32_t>{0, 4, 24}));
  EXPECT_EQ(z0.cu_seqlens_local, (std::vector<int32_t>{0, 2, 12}));
  EXPECT_EQ(z0.cu_seqlens_half, (std::vector<int32_t>{0, 1, 6}));
  EXPECT_EQ(z0.global_rows, (std::vector<int64_t>{0, 3, 4, 5, 6, 7, 8, 19, 20, 21, 22, 23}));
  EXPECT_EQ(z0.positions, (std::vector<int64_t>{0, 3, 0, 1, 2, 3, 4, 15, 16, 17, 18, 19}));
  EXPECT_EQ(z0.is_pad, (std::vector<uint8_t>{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}));
  ZigzagLayout z1 = zigzag_layout({1, 19}, 2, 1);
  EXPECT_EQ(z1.global_rows, (std::vector<int64_t>{1, 2, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}));
  EXPECT_EQ(z1.is_pad, (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_THROW(zigzag_layout({4}, 2, 2), Error);
}

INSTANTIATE_TEST_SUITE_P(Cases, ZigzagRing,
                         ::testing::Combine(::testing::Values(0, 1),
                                            ::testing::Values(DType::kF32, DType::kF64)),
                         [](const auto& info) {
                           return std::string(kCases[std::get<0>(info.param)].name) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace leantune::kernels

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  leantune::CommOptions o;
  o.backend = "mpi";
  (void)leantune::world_communicator(o);
  const int rc = RUN_ALL_TESTS();
  leantune::shutdown_communicators();
  return rc;
}
