// GPU tier for attention (kernels/attention.cu) on fresh random inputs.
// References:
//   ref64  the CPU op on the same inputs converted to f64 (out, lse, dq, dk, dv);
//   naive  a same-dtype implementation written here, as PyTorch runs it in bf16/f16: scores
//          rounded, softmax in f32 rounded, P V rounded, and the autograd chain of those ops
//          (each product rounded; GQA dK/dV summed over the group and rounded once).
// Flash-attention's rule (hopper/test_flash_attn.py): for out, dq, dk and dv,
//   max|ours - ref64| <= 2 max|naive - ref64| + floor,
// with a floor of 1e-4 max|ref64| for problems where the naive error happens to vanish. lse is
// compared with ref64 directly; -inf (rows that see no key) must match exactly, and a NaN
// anywhere fails. Outputs are written into guard-banded buffers pre-filled with a sentinel, so
// rows a kernel forgot to write fail too. f32 and f64 (the simple kernel) are compared with the
// CPU op at their own precision.
// Cases: sequences of length 0 and 1, many short plus a few long sequences, GQA ratios 1, 4 and
// 8 (and 7, Qwen2.5-0.5B's), head_dim 64 and 128 (and 96, the fallback), decode-style Lq < Lk and
// Lq > Lk (rows that see nothing), non-causal, rows after the last sequence, strided q, host and
// device cu_seqlens (i32 and i64), missing and too-small max_seqlen hints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "engine/dtype.h"
#include "kernel_test_util.h"
#include "kernels/attention.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::Guarded;
using Vec = std::vector<double>;
using kernel_test::flash_rule;
using kernel_test::max_abs_finite;
using kernel_test::max_err;

const Device kGpu = Device::cuda(0);

struct Case {
  std::string name;
  DType dt;
  int64_t hq, hk, d;
  std::vector<int64_t> lq;
  std::vector<int64_t> lk = {};  // empty: same as lq
  bool causal = true;
  int64_t tail_q = 0, tail_k = 0;  // rows after the last sequence
  int64_t window = 0;              // sliding window (0: none)
  double softcap = 0;              // score soft-cap (0: off; the simple kernels)
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) { return p.param.name; }

struct Problem {
  Case c;
  std::vector<int64_t> cq, ck;  // cu_seqlens
  int64_t tq = 0, tk = 0;
  Tensor q, k, v, dout;  // CPU, dtype c.dt
  double scale = 0;
};

Problem make_problem(const Case& c, uint64_t seed) {
  Problem p;
  p.c = c;
  const std::vector<int64_t>& lk = c.lk.empty() ? c.lq : c.lk;
  p.cq.push_back(0);
  p.ck.push_back(0);
  for (size_t b = 0; b < c.lq.size(); ++b) {
    p.cq.push_back(p.cq.back() + c.lq[b]);
    p.ck.push_back(p.ck.back() + lk[b]);
  }
  p.tq = p.cq.back() + c.tail_q;
  p.tk = p.ck.back() + c.tail_k;
  p.q = testing::randn({p.tq, c.hq, c.d}, c.dt, seed);
  p.k = testing::randn({p.tk, c.hk, c.d}, c.dt, seed + 1);
  p.v = testing::randn({p.tk, c.hk, c.d}, c.dt, seed + 2);
  p.dout = testing::randn({p.tq, c.hq, c.d}, c.dt, seed + 3);
  p.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  return p;
}

Tensor cu_tensor(const std::vector<int64_t>& cu, DType dt, Device dev) {
  Tensor t = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  if (dt != DType::kI64) t = t.to(dt);
  return dev.is_cpu() ? t : t.to(dev);
}

struct Result {
  Tensor out, lse, dq, dk, dv;  // host copies
};

// The CPU op in f64 on the same (rounded) inputs.
Result reference64(const Problem& p) {
  const Tensor q = p.q.to(DType::kF64), k = p.k.to(DType::kF64), v = p.v.to(DType::kF64);
  const Tensor g = p.dout.to(DType::kF64);
  const Tensor cq = cu_tensor(p.cq, DType::kI64, Device::cpu());
  const Tensor ck = cu_tensor(p.ck, DType::kI64, Device::cpu());
  kernels::AttentionOptions opt;
  opt.causal = p.c.causal;
  opt.window = p.c.window;
  opt.softcap = p.c.softcap;
  Result r;
  r.out = Tensor::empty(q.shape(), DType::kF64);
  r.lse = Tensor::empty({p.c.hq, p.tq}, DType::kF64);
  kernels::attention_fwd(q, k, v, cq, ck, opt, r.out, r.lse);
  r.dq = Tensor::empty(q.shape(), DType::kF64);
  r.dk = Tensor::empty(k.shape(), DType::kF64);
  r.dv = Tensor::empty(v.shape(), DType::kF64);
  kernels::attention_bwd(g, q, k, v, r.out, r.lse, cq, ck, opt, r.dq, r.dk, r.dv);
  return r;
}

double round_to(double x, DType dt) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(static_cast<float>(x)));
  if (dt == DType::kF32) return static_cast<float>(x);
  return x;
}

// The same-dtype chain PyTorch runs (flash-attention's attention_ref without upcast):
//   qs = r(q * scale); S = r(qs K^T), masked; A = r(softmax(S)) (0 for rows that see nothing);
//   O = r(A V). Backward: dA = r(dO V^T); dS = r(A (dA - rowsum(dA A))); dq = r(r(dS K) scale);
//   dK_h = r(dS^T qs), dV_h = r(A^T dO); dK, dV = r(sum over the group of dK_h, dV_h).
struct Naive {
  Vec out, dq, dk, dv;
};

Naive naive_same_dtype(const Problem& p) {
  const Case& c = p.c;
  const DType dt = c.dt;
  auto r = [dt](double x) { return round_to(x, dt); };
  const Vec q = p.q.to_f64(), k = p.k.to_f64(), v = p.v.to_f64(), g = p.dout.to_f64();
  const int64_t d = c.d, hq = c.hq, hk = c.hk, group = hq / hk;
  Naive n;
  n.out.assign(q.size(), 0.0);
  n.dq.assign(q.size(), 0.0);
  n.dk.assign(k.size(), 0.0);
  n.dv.assign(v.size(), 0.0);
  Vec dk_sum(k.size(), 0.0), dv_sum(v.size(), 0.0);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (size_t b = 0; b + 1 < p.cq.size(); ++b) {
    const int64_t q0 = p.cq[b], lq = p.cq[b + 1] - q0, k0 = p.ck[b], lk = p.ck[b + 1] - k0;
    if (lq == 0) continue;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      auto qi = [&](int64_t i, int64_t x) { return q[((q0 + i) * hq + h) * d + x]; };
      auto gi = [&](int64_t i, int64_t x) { return g[((q0 + i) * hq + h) * d + x]; };
      auto kj = [&](int64_t j, int64_t x) { return k[((k0 + j) * hk + kh) * d + x]; };
      auto vj = [&](int64_t j, int64_t x) { return v[((k0 + j) * hk + kh) * d + x]; };
      Vec qs(static_cast<size_t>(lq * d));
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t x = 0; x < d; ++x) qs[i * d + x] = r(qi(i, x) * p.scale);
      Vec a(static_cast<size_t>(lq * lk), 0.0);
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t vis =
            c.causal ? std::clamp<int64_t>(i + lk - lq + 1, 0, lk) : lk;  // keys i sees
        const int64_t lo = c.causal && c.window > 0 ? std::max<int64_t>(0, vis - c.window) : 0;
        if (vis <= lo) continue;
        Vec s(static_cast<size_t>(lk), neg_inf);
        double m = neg_inf;
        for (int64_t j = lo; j < vis; ++j) {
          double acc = 0;
          for (int64_t x = 0; x < d; ++x) acc += qs[i * d + x] * kj(j, x);
          s[j] = r(acc);
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = lo; j < vis; ++j) sum += std::exp(s[j] - m);
        for (int64_t j = lo; j < vis; ++j) a[i * lk + j] = r(std::exp(s[j] - m) / sum);
      }
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t x = 0; x < d; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < lk; ++j) acc += a[i * lk + j] * vj(j, x);
          n.out[((q0 + i) * hq + h) * d + x] = r(acc);
        }
      // Backward.
      Vec ds(static_cast<size_t>(lq * lk), 0.0);
      for (int64_t i = 0; i < lq; ++i) {
        Vec da(static_cast<size_t>(lk), 0.0);
        double dot = 0;
        for (int64_t j = 0; j < lk; ++j) {
          double acc = 0;
          for (int64_t x = 0; x < d; ++x) acc += gi(i, x) * vj(j, x);
          da[j] = r(acc);
          dot += da[j] * a[i * lk + j];
        }
        for (int64_t j = 0; j < lk; ++j) ds[i * lk + j] = r(a[i * lk + j] * (da[j] - dot));
      }
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t x = 0; x < d; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < lk; ++j) acc += ds[i * lk + j] * kj(j, x);
          n.dq[((q0 + i) * hq + h) * d + x] = r(r(acc) * p.scale);
        }
      for (int64_t j = 0; j < lk; ++j)
        for (int64_t x = 0; x < d; ++x) {
          double acck = 0, accv = 0;
          for (int64_t i = 0; i < lq; ++i) {
            acck += ds[i * lk + j] * qs[i * d + x];
            accv += a[i * lk + j] * gi(i, x);
          }
          dk_sum[((k0 + j) * hk + kh) * d + x] += r(acck);
          dv_sum[((k0 + j) * hk + kh) * d + x] += r(accv);
        }
    }
  }
  for (size_t i = 0; i < dk_sum.size(); ++i) {
    n.dk[i] = r(dk_sum[i]);
    n.dv[i] = r(dv_sum[i]);
  }
  return n;
}

struct Options {
  bool device_cu = true;
  DType cu_dt = DType::kI32;
  int hint = 1;            // 1: exact max_seqlen, 0: none, -1: too small (1)
  int64_t out_guard = 64;  // odd values misalign out/lse/grads (the copy fallback)
};

// Runs the CUDA forward and backward into guarded buffers and returns host copies.
Result run_cuda(const Problem& p, const Options& o, const Tensor& q_dev) {
  const Case& c = p.c;
  kernels::AttentionOptions opt;
  opt.causal = c.causal;
  opt.window = c.window;
  opt.softcap = c.softcap;
  if (o.hint != 0) {
    int64_t mq = 0, mk = 0;
    for (size_t b = 0; b + 1 < p.cq.size(); ++b) {
      mq = std::max(mq, p.cq[b + 1] - p.cq[b]);
      mk = std::max(mk, p.ck[b + 1] - p.ck[b]);
    }
    opt.max_seqlen_q = o.hint > 0 ? std::max<int64_t>(mq, 1) : 1;
    opt.max_seqlen_k = o.hint > 0 ? std::max<int64_t>(mk, 1) : 1;
  }
  const Device cu_dev = o.device_cu ? kGpu : Device::cpu();
  const Tensor cq = cu_tensor(p.cq, o.cu_dt, cu_dev), ck = cu_tensor(p.ck, o.cu_dt, cu_dev);
  const Tensor k = p.k.to(kGpu), v = p.v.to(kGpu), g = p.dout.to(kGpu);
  const DType sdt = c.dt == DType::kF64 ? DType::kF64 : DType::kF32;
  Guarded out(p.q.shape(), c.dt, kGpu, o.out_guard), lse({c.hq, p.tq}, sdt, kGpu, o.out_guard);
  kernels::attention_fwd_cuda(q_dev, k, v, cq, ck, opt, out.payload(), lse.payload());
  EXPECT_TRUE(out.check()) << "out";
  EXPECT_TRUE(lse.check()) << "lse";
  Guarded dq(p.q.shape(), c.dt, kGpu, o.out_guard), dk(p.k.shape(), c.dt, kGpu, o.out_guard),
      dv(p.v.shape(), c.dt, kGpu, o.out_guard);
  kernels::attention_bwd_cuda(g, q_dev, k, v, out.payload(), lse.payload(), cq, ck, opt,
                              dq.payload(), dk.payload(), dv.payload());
  EXPECT_TRUE(dq.check()) << "dq";
  EXPECT_TRUE(dk.check()) << "dk";
  EXPECT_TRUE(dv.check()) << "dv";
  Result r;
  r.out = out.payload().to(Device::cpu());
  r.lse = lse.payload().to(Device::cpu());
  r.dq = dq.payload().to(Device::cpu());
  r.dk = dk.payload().to(Device::cpu());
  r.dv = dv.payload().to(Device::cpu());
  return r;
}

void expect_matches(const Problem& p, const Result& ours, const Result& ref, const Naive* naive) {
  // lse in f32 from the same rounded inputs: agrees with f64 to ~1e-6 relative.
  const bool f64 = p.c.dt == DType::kF64;
  EXPECT_TRUE(
      testing::all_close(ours.lse.to(DType::kF64), ref.lse, f64 ? 1e-10 : 2e-4, f64 ? 1e-10 : 1e-5))
      << "lse";
  const Vec out = ours.out.to_f64(), dq = ours.dq.to_f64(), dk = ours.dk.to_f64(),
            dv = ours.dv.to_f64();
  const Vec rout = ref.out.to_f64(), rdq = ref.dq.to_f64(), rdk = ref.dk.to_f64(),
            rdv = ref.dv.to_f64();
  if (naive) {
    EXPECT_TRUE(flash_rule("out", out, naive->out, rout));
    EXPECT_TRUE(flash_rule("dq", dq, naive->dq, rdq));
    EXPECT_TRUE(flash_rule("dk", dk, naive->dk, rdk));
    EXPECT_TRUE(flash_rule("dv", dv, naive->dv, rdv));
  } else {
    // f32 / f64: the simple kernel against the CPU op at the input precision.
    const double tol = f64 ? 1e-10 : 2e-5;
    for (auto [name, a, b] : {std::tuple{"out", &out, &rout}, std::tuple{"dq", &dq, &rdq},
                              std::tuple{"dk", &dk, &rdk}, std::tuple{"dv", &dv, &rdv}}) {
      const double e = max_err(*a, *b);
      EXPECT_LE(e, tol * std::max(1.0, max_abs_finite(*b))) << name;
    }
  }
  // Rows that see no key (ref lse = -inf): out and dq exactly 0.
  const Vec rlse = ref.lse.to_f64();
  const int64_t hd = p.c.d;
  for (int64_t h = 0; h < p.c.hq; ++h)
    for (int64_t i = 0; i < p.tq; ++i) {
      if (rlse[h * p.tq + i] != -std::numeric_limits<double>::infinity()) continue;
      for (int64_t x = 0; x < hd; ++x) {
        const int64_t idx = (i * p.c.hq + h) * hd + x;
        ASSERT_EQ(out[idx], 0.0) << "out of a row that sees nothing: row " << i << " head " << h;
        ASSERT_EQ(dq[idx], 0.0) << "dq of a row that sees nothing: row " << i << " head " << h;
      }
    }
  // Rows after the last sequence: out 0, lse -inf, zero gradients.
  const int64_t row_q = p.c.hq * p.c.d, row_k = p.c.hk * p.c.d;
  for (int64_t i = p.cq.back() * row_q; i < p.tq * row_q; ++i) {
    ASSERT_EQ(out[i], 0.0) << "out tail element " << i;
    ASSERT_EQ(dq[i], 0.0) << "dq tail element " << i;
  }
  for (int64_t i = p.ck.back() * row_k; i < p.tk * row_k; ++i) {
    ASSERT_EQ(dk[i], 0.0) << "dk tail element " << i;
    ASSERT_EQ(dv[i], 0.0) << "dv tail element " << i;
  }
}

class AttentionCuda : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCuda, MatchesReferencesWithinFlashAttentionRule) {
  LT_SKIP_WITHOUT_CUDA();
  const Problem p = make_problem(GetParam(), 9001);
  const Result ref = reference64(p);
  const bool low = p.c.dt == DType::kBF16 || p.c.dt == DType::kF16;
  Naive naive;
  if (low) naive = naive_same_dtype(p);
  const Result ours = run_cuda(p, Options{}, p.q.to(kGpu));
  expect_matches(p, ours, ref, low ? &naive : nullptr);
}

TEST_P(AttentionCuda, CuSeqlensVariantsAndHintsGiveTheSameResult) {
  LT_SKIP_WITHOUT_CUDA();
  const Problem p = make_problem(GetParam(), 9101);
  const Tensor qd = p.q.to(kGpu);
  const Result base = run_cuda(p, Options{}, qd);
  Options host_i64;
  host_i64.device_cu = false;
  host_i64.cu_dt = DType::kI64;
  host_i64.hint = 0;
  Options dev_small_hint;
  dev_small_hint.hint = -1;
  Options dev_i64_nohint;
  dev_i64_nohint.cu_dt = DType::kI64;
  dev_i64_nohint.hint = 0;
  for (const Options& o : {host_i64, dev_small_hint, dev_i64_nohint}) {
    const Result r = run_cuda(p, o, qd);
    // Forward, dk and dv are deterministic; dq sums f32 atomics in any order.
    EXPECT_EQ(r.out.to_f64(), base.out.to_f64());
    EXPECT_EQ(r.lse.to_f64(), base.lse.to_f64());
    EXPECT_EQ(r.dk.to_f64(), base.dk.to_f64());
    EXPECT_EQ(r.dv.to_f64(), base.dv.to_f64());
    const double tol = p.c.dt == DType::kF64 ? 1e-12 : (p.c.dt == DType::kF32 ? 1e-5 : 2e-2);
    EXPECT_TRUE(testing::all_close(r.dq, base.dq, tol, tol));
  }
}

TEST_P(AttentionCuda, StridedAndMisalignedOperands) {
  LT_SKIP_WITHOUT_CUDA();
  const Problem p = make_problem(GetParam(), 9201);
  const Tensor qd = p.q.to(kGpu);
  const Result base = run_cuda(p, Options{}, qd);
  // q as a strided view into a wider buffer (rows of Hq*D + 8 elements), starting 8 elements in
  // (rows stay 16-byte aligned: used in place) or 1 element in (copied for the tensor cores);
  // outputs misaligned by 3 elements (written through a workspace).
  const int64_t w = p.c.hq * p.c.d;
  for (int64_t offset : {int64_t{8}, int64_t{1}}) {
    Tensor wide = Tensor::zeros({p.tq, w + 8}, p.c.dt, kGpu);
    Tensor qv = make_view(wide, {p.tq, p.c.hq, p.c.d}, {w + 8, p.c.d, 1}, wide.offset() + offset);
    qv.copy_(qd);
    Options o;
    o.out_guard = 3;
    const Result r = run_cuda(p, o, qv);
    EXPECT_EQ(r.out.to_f64(), base.out.to_f64()) << "offset " << offset;
    EXPECT_EQ(r.lse.to_f64(), base.lse.to_f64()) << "offset " << offset;
    EXPECT_EQ(r.dk.to_f64(), base.dk.to_f64()) << "offset " << offset;
    EXPECT_EQ(r.dv.to_f64(), base.dv.to_f64()) << "offset " << offset;
    const double tol = p.c.dt == DType::kF64 ? 1e-12 : (p.c.dt == DType::kF32 ? 1e-5 : 2e-2);
    EXPECT_TRUE(testing::all_close(r.dq, base.dq, tol, tol)) << "offset " << offset;
  }
}

// CPU tier (no "Cuda" in the suite name): the references and the rule themselves, checked with
// the CPU op in the input dtype as "ours" (f32 math, one rounding of each output), which must
// pass the same rule the CUDA kernels are held to.
TEST(AttentionFlashRuleReference, CpuOpInInputDtypePassesTheRule) {
  for (const Case& c :
       {Case{"cpu_bf16_gqa4", DType::kBF16, 4, 1, 64, {1, 40, 0, 17}, {}, true, 2, 1},
        Case{"cpu_f16_decode", DType::kF16, 2, 2, 32, {3, 0, 5}, {9, 2, 5}},
        Case{"cpu_bf16_rows_see_nothing", DType::kBF16, 2, 1, 32, {6, 4}, {2, 0}}}) {
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c, 9401);
    const Result ref = reference64(p);
    const Naive naive = naive_same_dtype(p);
    const Tensor cq = cu_tensor(p.cq, DType::kI32, Device::cpu());
    const Tensor ck = cu_tensor(p.ck, DType::kI32, Device::cpu());
    kernels::AttentionOptions opt;
    opt.causal = c.causal;
    Result ours;
    ours.out = Tensor::empty(p.q.shape(), c.dt);
    ours.lse = Tensor::empty({c.hq, p.tq}, DType::kF32);
    kernels::attention_fwd(p.q, p.k, p.v, cq, ck, opt, ours.out, ours.lse);
    ours.dq = Tensor::empty(p.q.shape(), c.dt);
    ours.dk = Tensor::empty(p.k.shape(), c.dt);
    ours.dv = Tensor::empty(p.v.shape(), c.dt);
    kernels::attention_bwd(p.dout, p.q, p.k, p.v, ours.out, ours.lse, cq, ck, opt, ours.dq, ours.dk,
                           ours.dv);
    expect_matches(p, ours, ref, &naive);
    // The naive reference is a real yardstick: it differs from ref64 by bf16/f16 rounding.
    EXPECT_GT(max_err(naive.out, ref.out.to_f64()), 0.0);
  }
}

TEST(AttentionCudaErrors, BadArgumentsThrow) {
  LT_SKIP_WITHOUT_CUDA();
  const Tensor q = testing::randn({4, 2, 64}, DType::kBF16, 1, kGpu);
  const Tensor k = testing::randn({4, 1, 64}, DType::kBF16, 2, kGpu);
  const Tensor cu = cu_tensor({0, 4}, DType::kI32, Device::cpu());
  Tensor out = Tensor::empty({4, 2, 64}, DType::kBF16, kGpu);
  Tensor lse = Tensor::empty({2, 4}, DType::kF32, kGpu);
  kernels::AttentionOptions opt;
  // Head dim beyond every kernel.
  const Tensor qb = testing::randn({4, 1, 640}, DType::kBF16, 3, kGpu);
  Tensor ob = Tensor::empty({4, 1, 640}, DType::kBF16, kGpu);
  Tensor lb = Tensor::empty({1, 4}, DType::kF32, kGpu);
  EXPECT_THROW(kernels::attention_fwd_cuda(qb, qb, qb, cu, cu, opt, ob, lb), Error);
  // Decreasing or overlong host cu_seqlens.
  EXPECT_THROW(kernels::attention_fwd_cuda(q, k, k, cu_tensor({0, 5}, DType::kI32, Device::cpu()),
                                           cu, opt, out, lse),
               Error);
  EXPECT_THROW(
      kernels::attention_fwd_cuda(q, k, k, cu_tensor({0, 3, 2}, DType::kI32, Device::cpu()),
                                  cu_tensor({0, 3, 2}, DType::kI32, Device::cpu()), opt, out, lse),
      Error);
  // Wrong lse dtype, GQA mismatch.
  Tensor lse64 = Tensor::empty({2, 4}, DType::kF64, kGpu);
  EXPECT_THROW(kernels::attention_fwd_cuda(q, k, k, cu, cu, opt, out, lse64), Error);
  const Tensor k3 = testing::randn({4, 3, 64}, DType::kBF16, 4, kGpu);
  EXPECT_THROW(kernels::attention_fwd_cuda(q, k3, k3, cu, cu, opt, out, lse), Error);
}

TEST(AttentionCudaDeterminism, ForwardDkDvAreBitwiseRepeatable) {
  LT_SKIP_WITHOUT_CUDA();
  Case c{"det", DType::kBF16, 8, 2, 128, {700, 1, 300}, {}, true};
  const Problem p = make_problem(c, 9301);
  const Tensor qd = p.q.to(kGpu);
  const Result a = run_cuda(p, Options{}, qd), b = run_cuda(p, Options{}, qd);
  EXPECT_EQ(a.out.to_f64(), b.out.to_f64());
  EXPECT_EQ(a.lse.to_f64(), b.lse.to_f64());
  EXPECT_EQ(a.dk.to_f64(), b.dk.to_f64());
  EXPECT_EQ(a.dv.to_f64(), b.dv.to_f64());
  EXPECT_TRUE(testing::all_close(a.dq, b.dq, 2e-2, 2e-2));
}

// The 4-warp (kBc = 64) head_dim-128 backward that devices with 99 KiB of opt-in shared memory
// (sm_86/sm_89) run, forced here on any device through LEANTUNE_ATTENTION_BWD_WARPS=4.
class AttentionCudaSmallBwdTile : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { setenv("LEANTUNE_ATTENTION_BWD_WARPS", "4", 1); }
  void TearDown() override { unsetenv("LEANTUNE_ATTENTION_BWD_WARPS"); }
};
TEST_P(AttentionCudaSmallBwdTile, MatchesReferencesWithinFlashAttentionRule) {
  LT_SKIP_WITHOUT_CUDA();
  const Problem p = make_problem(GetParam(), 9401);
  const Result ref = reference64(p);
  const Naive naive = naive_same_dtype(p);
  expect_matches(p, run_cuda(p, Options{}, p.q.to(kGpu)), ref, &naive);
}
INSTANTIATE_TEST_SUITE_P(
    D128, AttentionCudaSmallBwdTile,
    ::testing::Values(
        Case{"bf16_mha_short", DType::kBF16, 4, 4, 128, {1, 17, 64, 130, 257}},
        Case{"f16_gqa8_zero_lengths_tail",
             DType::kF16,
             8,
             1,
             128,
             {0, 300, 1, 0, 129},
             {},
             true,
             5,
             7},
        Case{"bf16_noncausal_lq_ne_lk", DType::kBF16, 4, 2, 128, {5, 100, 1}, {7, 64, 300}, false},
        Case{"bf16_window_varlen", DType::kBF16, 4, 2, 128, {1, 19, 300, 71}, {}, true, 0, 0, 45}),
    case_name);

// A device cu_seqlens with both max_seqlen hints is not read back; with cu[0] > 0 the rows before
// the first sequence are still written: out = 0, lse = -inf, dq = dk = dv = 0.
TEST(AttentionCudaDeviceCuSeqlens, RowsBeforeTheFirstSequenceAreFilled) {
  LT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kBF16, DType::kF32}) {
    Case c{"lead", dt, 4, 2, 128, {30, 70}, {}, true, 3, 2};
    Problem p = make_problem(c, 9501);
    for (auto& x : p.cq) x += 5;  // rows [0, 5) of q precede the first sequence
    for (auto& x : p.ck) x += 6;
    p.tq += 5;
    p.tk += 6;
    p.q = testing::randn({p.tq, c.hq, c.d}, dt, 9502);
    p.k = testing::randn({p.tk, c.hk, c.d}, dt, 9503);
    p.v = testing::randn({p.tk, c.hk, c.d}, dt, 9504);
    p.dout = testing::randn({p.tq, c.hq, c.d}, dt, 9505);
    const Result r = run_cuda(p, Options{}, p.q.to(kGpu));
    const Vec out = r.out.to_f64(), lse = r.lse.to_f64(), dq = r.dq.to_f64(), dk = r.dk.to_f64(),
              dv = r.dv.to_f64();
    const int64_t row_q = c.hq * c.d, row_k = c.hk * c.d;
    for (int64_t i = 0; i < 5 * row_q; ++i) {
      ASSERT_EQ(out[i], 0.0) << dtype_name(dt) << " out element " << i;
      ASSERT_EQ(dq[i], 0.0) << dtype_name(dt) << " dq element " << i;
    }
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < 5; ++i)
        ASSERT_EQ(lse[h * p.tq + i], -std::numeric_limits<double>::infinity()) << h << " " << i;
    for (int64_t i = 0; i < 6 * row_k; ++i) {
      ASSERT_EQ(dk[i], 0.0) << dtype_name(dt) << " dk element " << i;
      ASSERT_EQ(dv[i], 0.0) << dtype_name(dt) << " dv element " << i;
    }
    for (double x : out) ASSERT_TRUE(std::isfinite(x));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCuda,
    ::testing::Values(
        Case{"bf16_d128_mha_short", DType::kBF16, 4, 4, 128, {1, 17, 64, 130, 257}},
        Case{"bf16_d64_gqa4_many_short_few_long",
             DType::kBF16,
             8,
             2,
             64,
             {3, 1, 5, 0, 200, 7, 1, 2, 513, 9, 0, 33}},
        Case{"f16_d128_gqa8_zero_lengths_tail",
             DType::kF16,
             8,
             1,
             128,
             {0, 300, 1, 0, 129},
             {},
             true,
             5,
             7},
        Case{"bf16_d128_decode_lq_lt_lk",
             DType::kBF16,
             4,
             1,
             128,
             {1, 3, 0, 64, 1},
             {100, 3, 5, 257, 1}},
        Case{"bf16_d64_lq_gt_lk_rows_see_nothing", DType::kBF16, 2, 1, 64, {10, 70, 5}, {3, 0, 5}},
        Case{"bf16_d64_noncausal_gqa2", DType::kBF16, 4, 2, 64, {5, 100, 1}, {7, 64, 300}, false},
        Case{"bf16_d64_gqa7_qwen05b", DType::kBF16, 14, 2, 64, {40, 97}},
        Case{"bf16_d128_long", DType::kBF16, 2, 1, 128, {1100, 3}},
        Case{"bf16_d96_simple_kernel", DType::kBF16, 4, 2, 96, {1, 50, 77}},
        Case{"f32_d128_gqa4_tail", DType::kF32, 8, 2, 128, {1, 0, 65, 130}, {}, true, 3, 3},
        Case{"f64_d32_decode", DType::kF64, 2, 1, 32, {4, 0, 9}, {4, 2, 20}},
        Case{"f16_d64_tail_only_rows", DType::kF16, 2, 2, 64, {31, 0}, {}, true, 9, 4},
        // Sliding windows (Mistral, Gemma, Phi-3): windows shorter and longer than the tiles,
        // packed sequences, the KV-cache decode, a tail; soft-capped scores (simple kernels).
        Case{"bf16_d128_window_varlen",
             DType::kBF16,
             4,
             2,
             128,
             {1, 19, 300, 71, 229},
             {},
             true,
             0,
             0,
             37},
        Case{"bf16_d64_window_long", DType::kBF16, 8, 2, 64, {700, 1, 129}, {}, true, 3, 0, 200},
        Case{"f16_d128_window1_decode",
             DType::kF16,
             4,
             1,
             128,
             {1, 3, 0, 64, 1},
             {100, 3, 5, 257, 1},
             true,
             0,
             0,
             1},
        Case{"bf16_d64_window_decode",
             DType::kBF16,
             4,
             4,
             64,
             {1, 2, 5},
             {90, 40, 5},
             true,
             0,
             2,
             16},
        Case{"f32_d128_window_gqa4", DType::kF32, 8, 2, 128, {71, 1, 19}, {}, true, 0, 0, 9},
        Case{"f32_d64_softcap", DType::kF32, 4, 2, 64, {33, 1, 9}, {}, true, 0, 0, 0, 0.8},
        Case{"f64_d32_window_softcap_decode",
             DType::kF64,
             2,
             1,
             32,
             {4, 0, 9},
             {4, 2, 20},
             true,
             0,
             0,
             5,
             0.6}),
    case_name);

}  // namespace
}  // namespace leantune
