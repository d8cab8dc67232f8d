#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernel_test_util.h"
#include "kernels/attention.h"
#include "kernels/attention_ragged.h"
#include "kernels/attention_rows.h"

namespace leantune {
namespace {

using kernel_test::max_err;
using kernel_test::near_ref;
using kernel_test::round_all;
using kernel_test::Vec;
using kernels::AttentionOptions;
using testing::Guarded;
using testing::randn;

DType stat(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

Tensor cu_of(const std::vector<int64_t>& lens) {
  std::vector<int32_t> cu(1, 0);
  for (int64_t l : lens) cu.push_back(cu.back() + static_cast<int32_t>(l));
  return Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
}
int64_t total(const std::vector<int64_t>& lens) {
  return std::accumulate(lens.begin(), lens.end(), int64_t{0});
}

struct AttnCase {
  DType dt;
  int64_t hq, hk, d;
  std::vector<int64_t> lq, lk;  // lk empty: same as lq
  bool causal = true;
  std::string label;
  int64_t window = 0;  // sliding window (Mistral, Gemma, Phi-3); 0 = none
  double softcap = 0;  // score soft-cap; 0 = off
};

// The key range [lo, hi) query i of nq sees among nk keys.
std::pair<int64_t, int64_t> key_range(bool causal, int64_t window, int64_t i, int64_t nq,
                                      int64_t nk) {
  const int64_t hi = causal ? std::clamp<int64_t>(i + nk - nq + 1, 0, nk) : nk;
  return {causal && window > 0 ? std::max<int64_t>(0, hi - window) : 0, hi};
}

std::string attn_name(const ::testing::TestParamInfo<AttnCase>& p) {
  const AttnCase& c = p.param;
  return std::string(dtype_name(c.dt)) + "_Hq" + std::to_string(c.hq) + "_Hk" +
         std::to_string(c.hk) + "_D" + std::to_string(c.d) + "_" + c.label +
         (c.window ? "_window" + std::to_string(c.window) : "") + (c.softcap ? "_softcap" : "");
}

// Float64 reference, one (sequence, head) at a time with explicit loops. The backward uses the
// softmax Jacobian directly (dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)).
struct Ref {
  Vec out, lse, dq, dk, dv;
};
Ref reference(const Vec& q, const Vec& k, const Vec& v, const Vec& g,
              const std::vector<int64_t>& lq, const std::vector<int64_t>& lk, int64_t hq,
              int64_t hk, int64_t d, bool causal, double scale, int64_t window = 0,
              double cap = 0) {
  const int64_t tq = total(lq), tk = total(lk), grp = hq / hk;
  Ref r{Vec(tq * hq * d, 0.0), Vec(hq * tq, -INFINITY), Vec(tq * hq * d, 0.0),
        Vec(tk * hk * d, 0.0), Vec(tk * hk * d, 0.0)};
  int64_t q0 = 0, k0 = 0;
  for (size_t b = 0; b < lq.size(); ++b) {
    const int64_t nq = lq[b], nk = lk[b];
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / grp;
      auto Q = [&](int64_t i, int64_t j) { return q[((q0 + i) * hq + h) * d + j]; };
      auto K = [&](int64_t i, int64_t j) { return k[((k0 + i) * hk + kh) * d + j]; };
      auto V = [&](int64_t i, int64_t j) { return v[((k0 + i) * hk + kh) * d + j]; };
      auto G = [&](int64_t i, int64_t j) { return g[((q0 + i) * hq + h) * d + j]; };
      for (int64_t i = 0; i < nq; ++i) {
        const auto [lo, vis] = key_range(causal, window, i, nq, nk);
        if (vis <= lo) continue;
        Vec s(vis), p(vis), dp(vis), slope(vis, 1.0);
        double m = -INFINITY;
        for (int64_t j = lo; j < vis; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d; ++e) acc += Q(i, e) * K(j, e);
          s[j] = acc * scale;
          if (cap > 0) {
            const double t = std::tanh(s[j] / cap);
            s[j] = cap * t;
            slope[j] = 1 - t * t;
          }
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = lo; j < vis; ++j) sum += std::exp(s[j] - m);
        r.lse[h * tq + q0 + i] = m + std::log(sum);
        for (int64_t j = lo; j < vis; ++j) p[j] = std::exp(s[j] - m) / sum;
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = lo; j < vis; ++j) acc += p[j] * V(j, e);
          r.out[((q0 + i) * hq + h) * d + e] = acc;
        }
        double pdp = 0;
        for (int64_t j = lo; j < vis; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d; ++e) acc += G(i, e) * V(j, e);
          dp[j] = acc;
          pdp += p[j] * acc;
        }
        for (int64_t j = lo; j < vis; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * slope[j];
          for (int64_t e = 0; e < d; ++e) {
            r.dq[((q0 + i) * hq + h) * d + e] += ds * K(j, e) * scale;
            r.dk[((k0 + j) * hk + kh) * d + e] += ds * Q(i, e) * scale;
            r.dv[((k0 + j) * hk + kh) * d + e] += p[j] * G(i, e);
          }
        }
      }
    }
    q0 += nq;
    k0 += nk;
  }
  return r;
}

// Eager same-dtype attention as PyTorch computes it for 16-bit inputs: the score matmul rounded,
// scaled and rounded, softmax in f32 rounded, and P V rounded.
Vec naive_out(const Vec& q, const Vec& k, const Vec& v, const std::vector<int64_t>& lq,
              const std::vector<int64_t>& lk, int64_t hq, int64_t hk, int64_t d, bool causal,
              double scale, DType dt, int64_t window = 0) {
  const int64_t tq = total(lq), grp = hq / hk;
  Vec out(tq * hq * d, 0.0);
  int64_t q0 = 0, k0 = 0;
  for (size_t b = 0; b < lq.size(); ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / grp;
      for (int64_t i = 0; i < lq[b]; ++i) {
        const auto [lo, vis] = key_range(causal, window, i, lq[b], lk[b]);
        if (vis <= lo) continue;
        Vec s(vis - lo);
        for (int64_t j = lo; j < vis; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d; ++e)
            acc += q[((q0 + i) * hq + h) * d + e] * k[((k0 + j) * hk + kh) * d + e];
          s[j - lo] = kernel_test::round_to(kernel_test::round_to(acc, dt) * scale, dt);
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double x : s) sum += std::exp(x - m);
        for (double& x : s) x = std::exp(x - m) / sum;
        s = round_all(s, dt);
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = lo; j < vis; ++j) acc += s[j - lo] * v[((k0 + j) * hk + kh) * d + e];
          out[((q0 + i) * hq + h) * d + e] = kernel_test::round_to(acc, dt);
        }
      }
    }
    q0 += lq[b];
    k0 += lk[b];
  }
  return out;
}

class AttentionTest : public ::testing::TestWithParam<AttnCase> {
 protected:
  void SetUp() override {
    c_ = GetParam();
    lk_ = c_.lk.empty() ? c_.lq : c_.lk;
    tq_ = total(c_.lq);
    tk_ = total(lk_);
    q_ = randn({tq_, c_.hq, c_.d}, c_.dt, 1);
    k_ = randn({tk_, c_.hk, c_.d}, c_.dt, 2);
    v_ = randn({tk_, c_.hk, c_.d}, c_.dt, 3);
    opt_.causal = c_.causal;
    opt_.window = c_.window;
    opt_.softcap = c_.softcap;
    scale_ = 1.0 / std::sqrt(double(c_.d));
  }
  AttnCase c_;
  std::vector<int64_t> lk_;
  int64_t tq_ = 0, tk_ = 0;
  Tensor q_, k_, v_;
  AttentionOptions opt_;
  double scale_ = 1.0;
};

TEST_P(AttentionTest, ForwardAndBackwardMatchFloat64Reference) {
  Guarded out({tq_, c_.hq, c_.d}, c_.dt, Device::cpu()),
      lse({c_.hq, tq_}, stat(c_.dt), Device::cpu());
  kernels::attention_fwd(q_, k_, v_, cu_of(c_.lq), cu_of(lk_), opt_, out.payload(), lse.payload());
  EXPECT_TRUE(out.check());
  EXPECT_TRUE(lse.check());
  Tensor g = randn({tq_, c_.hq, c_.d}, c_.dt, 4);
  Vec qv = q_.to_f64(), kv = k_.to_f64(), vv = v_.to_f64();
  Ref r = reference(qv, kv, vv, g.to_f64(), c_.lq, lk_, c_.hq, c_.hk, c_.d, c_.causal, scale_,
                    c_.window, c_.softcap);
  if (c_.dt == DType::kBF16) {
    // flash-attention's rule: at most twice the error of the naive same-dtype computation.
    Vec naive =
        naive_out(qv, kv, vv, c_.lq, lk_, c_.hq, c_.hk, c_.d, c_.causal, scale_, c_.dt, c_.window);
    const double err = max_err(out.payload().to_f64(), r.out);
    EXPECT_LE(err, 2 * max_err(naive, r.out) + 1e-5) << "naive " << max_err(naive, r.out);
  } else {
    EXPECT_TRUE(near_ref(out.payload(), r.out, kernel_test::scaled_tol(c_.dt, 1.0)));
  }
  EXPECT_TRUE(near_ref(lse.payload(), r.lse, c_.dt == DType::kF64 ? 1e-12 : 1e-5, 1e-5));

  Guarded dq({tq_, c_.hq, c_.d}, c_.dt, Device::cpu()),
      dk({tk_, c_.hk, c_.d}, c_.dt, Device::cpu()), dv({tk_, c_.hk, c_.d}, c_.dt, Device::cpu());
  kernels::attention_bwd(g, q_, k_, v_, out.payload(), lse.payload(), cu_of(c_.lq), cu_of(lk_),
                         opt_, dq.payload(), dk.payload(), dv.payload());
  EXPECT_TRUE(dq.check());
  EXPECT_TRUE(dk.check());
  EXPECT_TRUE(dv.check());
  // Gradients sum over keys and over the query heads of a group: an absolute floor scaled by
  // the gradient's magnitude.
  for (auto [got, want, name] :
       {std::tuple{dq.payload(), &r.dq, "dq"}, std::tuple{dk.payload(), &r.dk, "dk"},
        std::tuple{dv.payload(), &r.dv, "dv"}}) {
    const double mag = std::max(1.0, kernel_test::max_abs(*want));
    testing::Tol t = kernel_test::scaled_tol(c_.dt, mag);
    if (c_.dt == DType::kBF16) t = {2e-2 * mag, 2e-2};
    EXPECT_TRUE(near_ref(got, *want, t)) << name;
  }
}

TEST_P(AttentionTest, AutogradMatchesRawBackward) {
  Tensor q = q_.clone().set_requires_grad(true), k = k_.clone().set_requires_grad(true),
         v = v_.clone().set_requires_grad(true);
  kernels::AttentionOutput o = kernels::attention(q, k, v, cu_of(c_.lq), cu_of(lk_), opt_);
  EXPECT_FALSE(o.lse.requires_grad());
  Tensor g = randn({tq_, c_.hq, c_.d}, c_.dt, 5);
  o.out.backward(g);
  Tensor dq = Tensor::empty(q.shape(), c_.dt), dk = Tensor::empty(k.shape(), c_.dt),
         dv = Tensor::empty(v.shape(), c_.dt);
  kernels::attention_bwd(g, q_, k_, v_, o.out.detach(), o.lse, cu_of(c_.lq), cu_of(lk_), opt_, dq,
                         dk, dv);
  EXPECT_TRUE(testing::all_close(q.grad(), dq, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(k.grad(), dk, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(v.grad(), dv, 0.0, 0.0));
}

// A varlen batch equals running every sequence alone (no cross-contamination).
TEST_P(AttentionTest, VarlenBatchEqualsEachSequenceAlone) {
  kernels::AttentionOutput all = kernels::attention(q_, k_, v_, cu_of(c_.lq), cu_of(lk_), opt_);
  int64_t q0 = 0, k0 = 0;
  for (size_t b = 0; b < c_.lq.size(); ++b) {
    const int64_t nq = c_.lq[b], nk = lk_[b];
    if (nq > 0) {
      kernels::AttentionOutput one =
          kernels::attention(q_.narrow(0, q0, nq), k_.narrow(0, k0, nk), v_.narrow(0, k0, nk),
                             cu_of({nq}), cu_of({nk}), opt_);
      EXPECT_TRUE(testing::all_close(all.out.narrow(0, q0, nq), one.out, 0.0, 0.0)) << "seq " << b;
      EXPECT_TRUE(testing::all_close(all.lse.narrow(1, q0, nq), one.lse, 0.0, 0.0)) << "seq " << b;
    }
    q0 += nq;
    k0 += nk;
  }
}

const std::vector<int64_t> kVarlen = {5, 1, 0, 9};

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionTest,
    ::testing::Values(AttnCase{DType::kF32, 2, 2, 64, kVarlen, {}, true, "varlen_len1_len0"},
                      AttnCase{DType::kF32, 4, 2, 128, kVarlen, {}, true, "varlen_gqa2"},
                      AttnCase{DType::kF32, 4, 1, 64, {19}, {}, true, "gqa4_len19"},
                      AttnCase{DType::kF32, 2, 1, 16, {150, 71}, {}, true, "multiblock"},
                      AttnCase{DType::kF32, 2, 2, 8, {1, 3, 2}, {7, 8, 2}, true, "decode_lq_lt_lk"},
                      AttnCase{
                          DType::kF32, 2, 1, 8, {4, 2}, {2, 0}, true, "lq_gt_lk_rows_see_nothing"},
                      AttnCase{DType::kF32, 2, 2, 8, {6, 3}, {4, 5}, false, "noncausal"},
                      AttnCase{DType::kBF16, 4, 2, 64, {33, 1, 0, 20}, {}, true, "varlen"},
                      AttnCase{DType::kBF16, 4, 1, 128, {1, 5}, {9, 5}, true, "decode"},
                      AttnCase{DType::kF16, 2, 1, 64, {7, 12}, {}, true, "varlen"},
                      AttnCase{DType::kF64, 4, 4, 8, {3, 0, 6}, {}, true, "varlen"},
                      AttnCase{DType::kF32, 1, 1, 1, {1}, {}, true, "single"},
                      // Sliding windows: awkward lengths around the window, packed sequences,
                      // blocks of queries that skip whole key ranges, the KV-cache decode
                      // (Lq < Lk), GQA, length 1.
                      AttnCase{DType::kF32, 2, 2, 64, kVarlen, {}, true, "varlen", 3},
                      AttnCase{DType::kF32, 4, 1, 16, {71, 1, 19}, {}, true, "awkward", 5},
                      AttnCase{DType::kF32, 2, 1, 16, {150, 71}, {}, true, "multiblock", 19},
                      AttnCase{DType::kF32, 2, 2, 8, {1, 3, 2}, {7, 8, 2}, true, "decode", 4},
                      AttnCase{DType::kF32, 2, 2, 8, {9}, {}, true, "window1", 1},
                      AttnCase{DType::kF32, 2, 2, 8, {9}, {}, true, "window_wider", 64},
                      AttnCase{DType::kBF16, 4, 2, 64, {33, 1, 0, 20}, {}, true, "varlen", 7},
                      AttnCase{DType::kF64, 4, 2, 8, {3, 0, 6}, {5, 0, 6}, true, "varlen", 2},
                      // Soft-capped scores (Gemma 2-style), alone and in a window.
                      AttnCase{DType::kF32, 4, 2, 64, kVarlen, {}, true, "varlen", 0, 0.7},
                      AttnCase{DType::kF64, 2, 1, 8, {1, 3, 2}, {7, 8, 2}, true, "decode", 3, 0.5}),
    attn_name);

struct GradCase {
  int64_t hq, hk, d;
  std::vector<int64_t> lq, lk;
  int64_t window = 0;
  double softcap = 0;
};

class AttentionGradcheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(AttentionGradcheck, Float64FiniteDifferences) {
  const GradCase c = GetParam();
  const std::vector<int64_t> lk = c.lk.empty() ? c.lq : c.lk;
  Tensor cq = cu_of(c.lq), ck = cu_of(lk);
  AttentionOptions opt;
  opt.window = c.window;
  opt.softcap = c.softcap;
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::attention(in[0], in[1], in[2], cq, ck, opt).out};
  };
  testing::GradcheckOptions go;
  go.max_elements = 150;
  EXPECT_TRUE(testing::gradcheck(f,
                                 {randn({total(c.lq), c.hq, c.d}, DType::kF64, 6),
                                  randn({total(lk), c.hk, c.d}, DType::kF64, 7),
                                  randn({total(lk), c.hk, c.d}, DType::kF64, 8)},
                                 go));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionGradcheck,
    ::testing::Values(GradCase{2, 2, 64, {3, 1, 0, 2}, {}}, GradCase{4, 2, 64, {3, 1, 0, 2}, {}},
                      GradCase{4, 1, 64, {4, 2}, {}}, GradCase{2, 1, 128, {3, 1}, {}},
                      GradCase{4, 1, 128, {1, 0, 3}, {}}, GradCase{2, 1, 8, {1, 2, 3}, {4, 2, 5}},
                      GradCase{2, 1, 8, {5, 1, 4}, {}, 2},
                      GradCase{2, 1, 8, {1, 2, 3}, {4, 2, 5}, 2},
                      GradCase{2, 2, 8, {4, 3}, {}, 0, 0.8}, GradCase{4, 2, 8, {5, 2}, {}, 3, 0.6}),
    [](const ::testing::TestParamInfo<GradCase>& p) {
      return "Hq" + std::to_string(p.param.hq) + "_Hk" + std::to_string(p.param.hk) + "_D" +
             std::to_string(p.param.d) + "_case" + std::to_string(p.index);
    });

TEST(Attention, RowsSeeingNoKeyGiveZeroOutputAndMinusInfinityLse) {
  // One sequence with 3 queries and 1 key: bottom-right alignment lets only the last query see it.
  Tensor q = randn({3, 1, 4}, DType::kF32, 9).set_requires_grad(true);
  Tensor k = randn({1, 1, 4}, DType::kF32, 10).set_requires_grad(true);
  Tensor v = randn({1, 1, 4}, DType::kF32, 11).set_requires_grad(true);
  kernels::AttentionOutput o = kernels::attention(q, k, v, cu_of({3}), cu_of({1}));
  Vec out = o.out.to_f64(), lse = o.lse.to_f64();
  for (int j = 0; j < 8; ++j) EXPECT_EQ(out[j], 0.0);
  EXPECT_TRUE(testing::all_close(o.out.narrow(0, 2, 1), v, 0.0, 0.0));
  EXPECT_EQ(lse[0], -INFINITY);
  EXPECT_EQ(lse[1], -INFINITY);
  EXPECT_TRUE(std::isfinite(lse[2]));
  o.out.backward(randn({3, 1, 4}, DType::kF32, 12));
  for (double x : q.grad().to_f64()) EXPECT_TRUE(std::isfinite(x));
  Vec dq = q.grad().to_f64();
  // Rows that see nothing get exactly 0; a softmax over a single key has no q gradient either
  // (up to the rounding of dO.V against dO.O).
  for (int j = 0; j < 8; ++j) EXPECT_EQ(dq[j], 0.0);
  for (int j = 8; j < 12; ++j) EXPECT_NEAR(dq[j], 0.0, 1e-6);
}

TEST(Attention, RowStridedInputsFromAFusedProjectionEqualContiguous) {
  // q, k, v as column slices of one [T, (Hq + 2 Hk) * D] buffer, viewed as [T, H, D].
  const int64_t t = 10, hq = 4, hk = 2, d = 8;
  Tensor qkv = randn({t, (hq + 2 * hk) * d}, DType::kF32, 13);
  auto slice = [&](int64_t off, int64_t h) {
    Tensor s = qkv.narrow(1, off * d, h * d);
    return make_view(s, {t, h, d}, {s.strides()[0], d, 1}, s.offset());
  };
  Tensor q = slice(0, hq), k = slice(hq, hk), v = slice(hq + hk, hk);
  ASSERT_FALSE(q.is_contiguous());
  kernels::AttentionOutput a = kernels::attention(q, k, v, cu_of({6, 4}), cu_of({6, 4}));
  kernels::AttentionOutput b = kernels::attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                  cu_of({6, 4}), cu_of({6, 4}));
  EXPECT_TRUE(testing::all_close(a.out, b.out, 0.0, 0.0));
  Tensor g = randn({t, hq, d}, DType::kF32, 14);
  Tensor dq1 = Tensor::empty({t, hq, d}, DType::kF32), dq2 = Tensor::empty({t, hq, d}, DType::kF32);
  Tensor dk1 = Tensor::empty({t, hk, d}, DType::kF32), dk2 = Tensor::empty({t, hk, d}, DType::kF32);
  Tensor dv1 = Tensor::empty({t, hk, d}, DType::kF32), dv2 = Tensor::empty({t, hk, d}, DType::kF32);
  kernels::attention_bwd(g, q, k, v, a.out, a.lse, cu_of({6, 4}), cu_of({6, 4}), {}, dq1, dk1, dv1);
  kernels::attention_bwd(g, q.contiguous(), k.contiguous(), v.contiguous(), b.out, b.lse,
                         cu_of({6, 4}), cu_of({6, 4}), {}, dq2, dk2, dv2);
  EXPECT_TRUE(testing::all_close(dq1, dq2, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(dk1, dk2, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(dv1, dv2, 0.0, 0.0));
}

TEST(Attention, RowsBeyondTheLastSequenceAreZeroed) {
  Tensor q = randn({6, 2, 4}, DType::kF32, 15), k = randn({6, 1, 4}, DType::kF32, 16);
  Tensor v = randn({6, 1, 4}, DType::kF32, 17);
  Tensor out = Tensor::full({6, 2, 4}, 3.0, DType::kF32), lse = Tensor::zeros({2, 6}, DType::kF32);
  kernels::attention_fwd(q, k, v, cu_of({2, 2}), cu_of({2, 2}), {}, out, lse);
  Vec o = out.to_f64(), l = lse.to_f64();
  for (int64_t i = 4 * 8; i < 6 * 8; ++i) EXPECT_EQ(o[i], 0.0);
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(l[h * 6 + 4], -INFINITY);
    EXPECT_EQ(l[h * 6 + 5], -INFINITY);
  }
}

TEST(Attention, BadShapesAndSeqlensAreErrors) {
  Tensor q = randn({4, 3, 8}, DType::kF32, 18), k = randn({4, 2, 8}, DType::kF32, 19);
  EXPECT_THROW(kernels::attention(q, k, k, cu_of({4}), cu_of({4})), Error);  // 3 % 2 != 0
  Tensor q2 = randn({4, 2, 8}, DType::kF32, 20);
  EXPECT_THROW(kernels::attention(q2, k, k, cu_of({5}), cu_of({4})), Error);
  EXPECT_THROW(kernels::attention(q2, k, k, cu_of({4}), cu_of({2, 2})), Error);
  EXPECT_THROW(kernels::attention(q2, k, k, Tensor::from_vector<int32_t>({0, 3, 2}, {3}),
                                  Tensor::from_vector<int32_t>({0, 3, 2}, {3})),
               Error);
}

// total_seqlen is a hint where the host does not read cu_seqlens; where it does, it must be
// where they end.
TEST(Attention, TotalSeqlenHintIsCheckedAgainstCuSeqlens) {
  const Tensor q = randn({8, 2, 8}, DType::kF32, 41);
  kernels::AttentionOptions opt;
  opt.total_seqlen = 6;
  const Tensor cu = cu_of({4, 2});  // 0, 4, 6 over 8 rows
  EXPECT_EQ(kernels::attention(q, q, q, cu, cu, opt).out.to_f64(),
            kernels::attention(q, q, q, cu, cu).out.to_f64());
  opt.total_seqlen = 8;
  EXPECT_THROW(kernels::attention(q, q, q, cu, cu, opt), Error);
}

// cudnn_attention_status answers on any machine: without a usable cuDNN it says why (no CUDA
// backend, no device, no cuDNN library, a build without the frontend headers), and the CPU op
// never calls cuDNN.
TEST(Attention, CudnnStatusSaysWhyWhenUnavailable) {
  const kernels::CudnnAttentionStatus before = kernels::cudnn_attention_status(0);
  if (!before.available) {
    EXPECT_FALSE(before.why.empty());
  }
  EXPECT_GE(before.calls, 0);
  Tensor q = randn({6, 2, 8}, DType::kBF16, 31);
  (void)kernels::attention(q, q, q, cu_of({6}), cu_of({6}));
  EXPECT_EQ(kernels::cudnn_attention_status(0).calls, before.calls);
}

// The ragged layout the cuDNN path hands cuDNN (kernels/attention_ragged.h), replayed on the host:
// sequences where cu puts them, zero-length and padding entries empty, lengths clipped to the
// bucket, and a device cu_seqlens holding garbage still kept inside [0, t].
struct RaggedCase {
  std::vector<int32_t> cu;
  int64_t t, cap;
  int nb;
  std::vector<int64_t> starts, lens;  // nb + 1 starts, nb lengths
};
class AttentionRaggedLayout : public ::testing::TestWithParam<RaggedCase> {};
TEST_P(AttentionRaggedLayout, EntriesAreTheSequencesClampedAndClipped) {
  const RaggedCase& c = GetParam();
  const int batch = static_cast<int>(c.cu.size()) - 1;
  for (int b = 0; b <= c.nb; ++b) {
    const int64_t start = kernels::ragged_start(c.cu.data(), b, batch, c.t);
    EXPECT_EQ(start, c.starts[b]) << "entry " << b;
    if (b == c.nb) continue;
    const int64_t len = kernels::ragged_len(c.cu.data(), b, batch, c.t, c.cap);
    EXPECT_EQ(len, c.lens[b]) << "entry " << b;
    EXPECT_TRUE(start >= 0 && len >= 0 && start + len <= c.t) << "entry " << b;
  }
}
INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionRaggedLayout,
    ::testing::Values(
        // Three sequences (one empty), one padding entry.
        RaggedCase{{0, 3, 3, 10}, 12, 64, 4, {0, 3, 3, 10, 10}, {3, 0, 7, 0}},
        // A bucket smaller than the longest sequence clips it.
        RaggedCase{{0, 3, 3, 10}, 12, 4, 4, {0, 3, 3, 10, 10}, {3, 0, 4, 0}},
        // One sequence of one row, padded to two entries.
        RaggedCase{{0, 1}, 1, 64, 2, {0, 1, 1}, {1, 0}},
        // Rows before cu[0] (a device cu_seqlens is not validated): entry 0 starts there.
        RaggedCase{{5, 30, 100}, 103, 128, 2, {5, 30, 100}, {25, 70}},
        // Garbage: negative, beyond t, decreasing.
        RaggedCase{{-5, 20, 7}, 10, 64, 4, {0, 10, 7, 7, 7}, {10, 0, 0, 0}}));

TEST(Attention, RaggedBucketsArePowersOfTwoFromTheFloor) {
  EXPECT_EQ(kernels::pow2_bucket(0, 1), 1);
  EXPECT_EQ(kernels::pow2_bucket(1, 1), 1);
  EXPECT_EQ(kernels::pow2_bucket(5, 1), 8);
  EXPECT_EQ(kernels::pow2_bucket(1, 64), 64);
  EXPECT_EQ(kernels::pow2_bucket(64, 64), 64);
  EXPECT_EQ(kernels::pow2_bucket(65, 64), 128);
  EXPECT_EQ(kernels::pow2_bucket(32769, 64), 65536);
}

// The dense cuDNN graph reads sequence b at rows [b S, (b + 1) S): taken exactly when, with S the
// true longest length, every sequence has S rows and they cover every row, over every packing of
// up to 5 sequences of up to 4 rows (empty ones included), each also with unused rows after the
// last sequence and with a cu_seqlens the host has not read.
TEST(Attention, DenseBatchIsExactlyTheEqualLengthBatch) {
  int dense = 0, ragged = 0;
  for (int batch = 1; batch <= 5; ++batch) {
    int64_t codes = 1;
    for (int b = 0; b < batch; ++b) codes *= 5;
    for (int64_t code = 0; code < codes; ++code) {
      std::vector<int32_t> cu = {0};
      int64_t longest = 0;
      bool equal = true;
      for (int64_t c = code, b = 0; b < batch; ++b, c /= 5) {
        const int32_t len = static_cast<int32_t>(c % 5);
        cu.push_back(cu.back() + len);
        longest = std::max<int64_t>(longest, len);
        equal = equal && len == cu[1];
      }
      const int64_t t = cu.back();
      // Rows past the last sequence: t == batch * S can then hold with unequal lengths (cu 0, 4,
      // 6 over 8 rows); an unread cu_seqlens (covered -1) is never dense.
      for (int64_t extra = 1; extra <= 4; ++extra)
        EXPECT_FALSE(kernels::dense_batch(batch, t + extra, longest, t))
            << "batch " << batch << " code " << code << " extra " << extra;
      EXPECT_FALSE(kernels::dense_batch(batch, t, longest, -1));
      const bool d = kernels::dense_batch(batch, t, longest, t);
      EXPECT_EQ(d, equal && longest > 0) << "batch " << batch << " code " << code;
      if (!d) {
        ++ragged;
        continue;
      }
      ++dense;
      for (int b = 0; b <= batch; ++b)
        EXPECT_EQ(kernels::ragged_start(cu.data(), b, batch, t), b * longest);
    }
  }
  EXPECT_EQ(dense, 5 * 4);  // per batch size, lengths 1..4
  EXPECT_GT(ragged, 3000);
  EXPECT_FALSE(kernels::dense_batch(0, 0, 0, 0));
  EXPECT_FALSE(kernels::dense_batch(2, 0, 0, 0));
  EXPECT_FALSE(kernels::dense_batch(2, 8, 4, 6));  // cu 0, 4, 6 over 8 rows
}

// The CUDA tensor-core path never visits rows outside every sequence; its fill kernel writes them
// through kernels/attention_rows.h, replayed here element by element. A device cu_seqlens with
// both max_seqlen hints is not validated, so cu[0] > 0 must fill the rows before it as well as
// those after cu[B] (formerly only the latter were written: rows before cu[0] of out, lse, dk
// and dv kept whatever the memory held).
struct UncoveredCase {
  int cu_first, cu_last, rows;
  bool transposed;
};
class AttentionUncoveredRows : public ::testing::TestWithParam<UncoveredCase> {};
TEST_P(AttentionUncoveredRows, FillWritesExactlyTheRowsOutsideEverySequence) {
  const UncoveredCase c = GetParam();
  const int64_t row_elems = 19;
  std::vector<int> x(static_cast<size_t>(c.rows * row_elems), 0);
  const kernels::UncoveredRows u = kernels::uncovered_rows(c.cu_first, c.cu_last, c.rows);
  for (int64_t idx = 0; idx < u.count(c.rows) * row_elems; ++idx) {
    const int64_t off = kernels::uncovered_offset(idx, u, c.rows, row_elems, c.transposed);
    ASSERT_GE(off, 0);
    ASSERT_LT(off, static_cast<int64_t>(x.size()));
    ++x[static_cast<size_t>(off)];
  }
  const int first = std::clamp(c.cu_first, 0, c.rows);
  const int last = std::clamp(c.cu_last, first, c.rows);
  for (int r = 0; r < c.rows; ++r) {
    const int want = r < first || r >= last ? 1 : 0;
    for (int64_t e = 0; e < row_elems; ++e) {
      const int64_t off = c.transposed ? e * c.rows + r : r * row_elems + e;
      ASSERT_EQ(x[static_cast<size_t>(off)], want) << "row " << r << " element " << e;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionUncoveredRows,
    ::testing::Values(UncoveredCase{0, 71, 71, false}, UncoveredCase{0, 50, 71, false},
                      UncoveredCase{5, 50, 71, false}, UncoveredCase{5, 50, 71, true},
                      UncoveredCase{1, 1, 1, false}, UncoveredCase{3, 2, 19, true},
                      UncoveredCase{-4, 80, 71, false}, UncoveredCase{71, 71, 71, true}),
    [](const ::testing::TestParamInfo<UncoveredCase>& p) {
      const UncoveredCase& c = p.param;
      return "cu" + std::to_string(c.cu_first < 0 ? 0 : c.cu_first) + "to" +
             std::to_string(c.cu_last) + (c.cu_first < 0 ? "neg" : "") + "_rows" +
             std::to_string(c.rows) + (c.transposed ? "_transposed" : "");
    });

}  // namespace
}  // namespace leantune
