#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernel_test_util.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/linear_cross_entropy_grad.h"
#include "kernels/softcap.h"
#include "testing/functional.h"

namespace leantune {
namespace {

using kernel_test::make;
using kernel_test::near_ref;
using kernel_test::Vec;
using kernels::kIgnoreIndex;
using kernels::LinearCrossEntropyOptions;
using testing::Guarded;
using testing::randn;

DType work(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

// Targets with 0, V-1 and some ignored rows.
Tensor make_targets(int64_t t, int64_t v, uint64_t seed) {
  Vec y(static_cast<size_t>(t));
  Generator g(seed, RngPurpose::kTest);
  for (int64_t i = 0; i < t; ++i) y[i] = static_cast<double>(g.next_below(v));
  if (t > 0) y[0] = 0;
  if (t > 1) y[t - 1] = static_cast<double>(v - 1);
  for (int64_t i = 1; i < t; i += 4) y[i] = kIgnoreIndex;
  return make(y, {t}, DType::kI64);
}

// Float64 reference: per-row nll, logp, and the gradients of sum(coef_t * nll_t).
struct Ref {
  Vec nll, dx, dw;
};
Ref reference(const Vec& x, const Vec& w, const std::vector<int64_t>& y, int64_t t, int64_t h,
              int64_t v, const Vec& coef) {
  Ref r{Vec(t, 0.0), Vec(t * h, 0.0), Vec(v * h, 0.0)};
  Vec z(v);
  for (int64_t i = 0; i < t; ++i) {
    if (y[i] == kIgnoreIndex) continue;
    double m = -INFINITY;
    for (int64_t k = 0; k < v; ++k) {
      double s = 0;
      for (int64_t j = 0; j < h; ++j) s += x[i * h + j] * w[k * h + j];
      z[k] = s;
      m = std::max(m, s);
    }
    double se = 0;
    for (int64_t k = 0; k < v; ++k) se += std::exp(z[k] - m);
    const double lse = m + std::log(se);
    r.nll[i] = lse - z[y[i]];
    for (int64_t k = 0; k < v; ++k) {
      const double g = (std::exp(z[k] - lse) - (k == y[i] ? 1.0 : 0.0)) * coef[i];
      for (int64_t j = 0; j < h; ++j) {
        r.dx[i * h + j] += g * w[k * h + j];
        r.dw[k * h + j] += g * x[i * h + j];
      }
    }
  }
  return r;
}

// ||a - r|| / ||r|| (Frobenius).
double rel_err(const Vec& a, const Vec& r) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - r[i]) * (a[i] - r[i]);
    den += r[i] * r[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct LceCase {
  DType dt;
  int64_t t, h, v, chunk;
};

std::string lce_name(const ::testing::TestParamInfo<LceCase>& p) {
  const LceCase& c = p.param;
  return std::string(dtype_name(c.dt)) + "_T" + std::to_string(c.t) + "_H" + std::to_string(c.h) +
         "_V" + std::to_string(c.v) + "_chunk" + std::to_string(c.chunk);
}

class LinearCrossEntropyTest : public ::testing::TestWithParam<LceCase> {};

TEST_P(LinearCrossEntropyTest, RawFusedPassMatchesFloat64Reference) {
  const LceCase c = GetParam();
  Tensor x = randn({c.t, c.h}, c.dt, 1), w = randn({c.v, c.h}, c.dt, 2, Device::cpu(), 0.5);
  Tensor y = make_targets(c.t, c.v, 3);
  const double scale = 0.25;
  Guarded dx({c.t, c.h}, c.dt, Device::cpu());
  dx.payload().fill_(5.0);  // overwritten, ignored rows included
  Guarded dw({c.v, c.h}, c.dt, Device::cpu());
  dw.payload().fill_(1.0);  // accumulated into
  const double loss = kernels::linear_cross_entropy_fwd_bwd(
      x, w, y, scale, dx.payload(), dw.payload(), LinearCrossEntropyOptions{c.chunk});
  EXPECT_TRUE(dx.check());
  EXPECT_TRUE(dw.check());
  Ref r = reference(x.to_f64(), w.to_f64(), y.to_i64(), c.t, c.h, c.v, Vec(c.t, scale));
  double want = 0;
  for (double l : r.nll) want += l;
  EXPECT_NEAR(loss, want, (c.dt == DType::kF64 ? 1e-12 : 2e-5) * (1 + std::abs(want)));
  for (double& e : r.dw) e += 1.0;
  Vec dxv = dx.payload().to_f64(), dwv = dw.payload().to_f64();
  const double lim = c.dt == DType::kF64 ? 1e-12 : c.dt == DType::kF32 ? 1e-5 : 4e-3;
  EXPECT_LT(rel_err(dxv, r.dx), lim);
  // A 16-bit dW is accumulated in its own dtype, rounded once per chunk of valid rows: the error
  // grows with the number of chunks (about sqrt of it, the roundings being independent).
  std::vector<int64_t> yv = y.to_i64();
  const int64_t valid =
      std::count_if(yv.begin(), yv.end(), [](int64_t t) { return t != kIgnoreIndex; });
  const double chunks = static_cast<double>(std::max<int64_t>(1, (valid + c.chunk - 1) / c.chunk));
  EXPECT_LT(rel_err(dwv, r.dw), dtype_size(c.dt) == 2 ? lim * std::sqrt(chunks) : lim);
  for (int64_t i = 0; i < c.t; ++i) {
    if (yv[i] != kIgnoreIndex) continue;
    for (int64_t j = 0; j < c.h; ++j) ASSERT_EQ(dxv[i * c.h + j], 0.0) << "row " << i;
  }
}

TEST_P(LinearCrossEntropyTest, EqualsFullLogitsLinearPlusCrossEntropy) {
  const LceCase c = GetParam();
  Tensor x0 = randn({c.t, c.h}, c.dt, 4), w0 = randn({c.v, c.h}, c.dt, 5, Device::cpu(), 0.5);
  Tensor y = make_targets(c.t, c.v, 6);
  const double norm = 3.0;
  Tensor x1 = x0.clone().set_requires_grad(true), w1 = w0.clone().set_requires_grad(true);
  Tensor fused = kernels::linear_cross_entropy(x1, w1, y, norm, {c.chunk});
  fused.backward(Tensor::full({}, 0.5, work(c.dt)));
  // The unfused path in the work dtype (f32 logits, as the fused one uses).
  Tensor x2 = x0.to(work(c.dt)).set_requires_grad(true);
  Tensor w2 = w0.to(work(c.dt)).set_requires_grad(true);
  Tensor full = kernels::cross_entropy(kernels::linear(x2, w2), y, norm);
  full.backward(Tensor::full({}, 0.5, work(c.dt)));
  const double tol = c.dt == DType::kF64 ? 1e-12 : 2e-5;
  EXPECT_NEAR(fused.item(), full.item(), tol * (1 + std::abs(full.item())));
  const double lim = c.dt == DType::kF64 ? 1e-12 : c.dt == DType::kF32 ? 1e-5 : 4e-3;
  EXPECT_LT(rel_err(x1.grad().to_f64(), x2.grad().to_f64()), lim);
  EXPECT_LT(rel_err(w1.grad().to_f64(), w2.grad().to_f64()), lim);
  EXPECT_EQ(x1.grad().dtype(), c.dt);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearCrossEntropyTest,
                         ::testing::Values(LceCase{DType::kF32, 1, 1, 1, 1024},
                                           LceCase{DType::kF32, 19, 19, 19, 4},
                                           LceCase{DType::kF32, 71, 19, 229, 16},
                                           LceCase{DType::kF32, 71, 19, 229, 1024},
                                           LceCase{DType::kBF16, 71, 19, 229, 7},
                                           // H 2048: the head converted in blocks of 2048 rows
                                           LceCase{DType::kBF16, 19, 2048, 4099, 7},
                                           LceCase{DType::kF16, 19, 8, 50, 5},
                                           LceCase{DType::kF64, 13, 5, 11, 3}),
                         lce_name);

TEST(LinearCrossEntropy, GradcheckFloat64) {
  Tensor y = make_targets(9, 7, 7);
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::linear_cross_entropy(in[0], in[1], y, 5.0, {4})};
  };
  EXPECT_TRUE(
      testing::gradcheck(f, {randn({9, 4}, DType::kF64, 8), randn({7, 4}, DType::kF64, 9)}));
}

// Gemma's final logit soft-capping inside the chunks equals capping full logits, then the loss;
// gradients by float64 finite differences.
TEST(LinearCrossEntropy, SoftcapEqualsCappedFullLogits) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16}) {
    const int64_t t = 71, h = 19, v = 229;
    Tensor x0 = randn({t, h}, dt, 30, Device::cpu(), 3.0), w0 = randn({v, h}, dt, 31);
    Tensor y = make_targets(t, v, 32);
    Tensor x1 = x0.clone().set_requires_grad(true), w1 = w0.clone().set_requires_grad(true);
    kernels::LinearCrossEntropyOptions lo;
    lo.chunk_tokens = 16;
    lo.softcap = 2.5;
    Tensor fused = kernels::linear_cross_entropy(x1, w1, y, 3.0, lo);
    fused.backward();
    Tensor x2 = x0.to(work(dt)).set_requires_grad(true);
    Tensor w2 = w0.to(work(dt)).set_requires_grad(true);
    Tensor full = kernels::cross_entropy(kernels::softcap(kernels::linear(x2, w2), 2.5), y, 3.0);
    full.backward();
    const double tol = dt == DType::kF64 ? 1e-12 : 2e-5;
    EXPECT_NEAR(fused.item(), full.item(), tol * (1 + std::abs(full.item()))) << dtype_name(dt);
    const double lim = dt == DType::kF64 ? 1e-10 : dt == DType::kF32 ? 1e-5 : 4e-3;
    EXPECT_LT(rel_err(x1.grad().to_f64(), x2.grad().to_f64()), lim) << dtype_name(dt);
    EXPECT_LT(rel_err(w1.grad().to_f64(), w2.grad().to_f64()), lim) << dtype_name(dt);
  }
  Tensor y = make_targets(9, 7, 33);
  kernels::LinearCrossEntropyOptions lo;
  lo.chunk_tokens = 4;
  lo.softcap = 1.5;
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::linear_cross_entropy(in[0], in[1], y, 5.0, lo)};
  };
  EXPECT_TRUE(testing::gradcheck(
      f, {randn({9, 4}, DType::kF64, 34, Device::cpu(), 2.0), randn({7, 4}, DType::kF64, 35)}));
}

TEST(LinearCrossEntropy, ChunkingDoesNotChangeTheResultBeyondRounding) {
  Tensor x = randn({50, 16}, DType::kF32, 10), w = randn({40, 16}, DType::kF32, 11);
  Tensor y = make_targets(50, 40, 12);
  Tensor dx1 = Tensor::empty({50, 16}, DType::kF32), dw1 = Tensor::zeros({40, 16}, DType::kF32);
  Tensor dx2 = Tensor::empty({50, 16}, DType::kF32), dw2 = Tensor::zeros({40, 16}, DType::kF32);
  const double l1 = kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dx1, dw1, {1});
  const double l2 = kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dx2, dw2, {1000});
  EXPECT_NEAR(l1, l2, 1e-5 * std::abs(l1));
  EXPECT_TRUE(testing::all_close(dx1, dx2, 1e-6, 1e-5));
  EXPECT_TRUE(testing::all_close(dw1, dw2, 1e-5, 1e-5));
}

TEST(LinearCrossEntropy, AllTargetsIgnoredGivesZeroLossAndZeroGradients) {
  Tensor x = randn({5, 3}, DType::kBF16, 13).set_requires_grad(true);
  Tensor w = randn({4, 3}, DType::kBF16, 14).set_requires_grad(true);
  Tensor y = make(Vec(5, kIgnoreIndex), {5}, DType::kI32);
  Tensor loss = kernels::linear_cross_entropy(x, w, y, 1.0);
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  for (double v : x.grad().to_f64()) EXPECT_EQ(v, 0.0);
  for (double v : w.grad().to_f64()) EXPECT_EQ(v, 0.0);
}

TEST(LinearCrossEntropy, OutOfRangeTargetIsAnError) {
  Tensor x = randn({3, 4}, DType::kF32, 15), w = randn({6, 4}, DType::kF32, 16);
  EXPECT_THROW(kernels::linear_cross_entropy(x, w, make({0, 6, 1}, {3}, DType::kI64), 1.0), Error);
  EXPECT_THROW(kernels::linear_token_logprobs(x, w, make({0, -2, 1}, {3}, DType::kI64)), Error);
}

// Peak memory of forward + backward beyond the inputs and the returned gradients, for T = 256
// and T = 4096 tokens with the same chunk: equal (full logits would grow 16x).
TEST(LinearCrossEntropy, PeakExtraMemoryDoesNotGrowWithTokens) {
  const int64_t h = 32, v = 512, chunk = 64;
  Allocator& a = allocator(Device::cpu());
  std::vector<int64_t> extra, workspace;
  for (int64_t t : {256, 4096}) {
    Tensor x = randn({t, h}, DType::kF32, 17).set_requires_grad(true);
    Tensor w = randn({v, h}, DType::kF32, 18).set_requires_grad(true);
    Tensor y = make_targets(t, v, 19);
    a.empty_cache();
    const int64_t base = a.stats().allocated.current;
    a.reset_peak_stats();
    {
      Tensor loss = kernels::linear_cross_entropy(x, w, y, double(t), {chunk});
      loss.backward();
    }
    const AllocatorStats s = a.stats();
    const int64_t grads = (t * h + v * h) * 4;  // dhidden and dW, which backward hands out
    extra.push_back(s.allocated.peak - base - grads);
    workspace.push_back(s.tag(MemTag::kWorkspace).peak);
    x.zero_grad();
    w.zero_grad();
  }
  const int64_t chunk_bytes = chunk * v * 4;
  EXPECT_EQ(workspace[0], workspace[1]);
  EXPECT_GT(workspace[0], chunk_bytes);      // the chunk's logits are there...
  EXPECT_LT(workspace[0], 2 * chunk_bytes);  // ...and little else
  EXPECT_LE(std::abs(extra[1] - extra[0]), 64 * 1024) << extra[0] << " vs " << extra[1];
  EXPECT_LT(extra[1], 4096 * v * 4 / 8) << "a fraction of full logits";
}

TEST(LinearCrossEntropy, FrozenWeightGetsNoGradientAndNoWeightSizedBuffer) {
  const int64_t v = 1024, h = 64;
  Tensor x = randn({8, h}, DType::kF32, 20).set_requires_grad(true);
  Tensor w = randn({v, h}, DType::kF32, 21);
  Tensor y = make_targets(8, v, 22);
  Allocator& a = allocator(Device::cpu());
  const int64_t base = a.stats().allocated.current;
  a.reset_peak_stats();
  kernels::linear_cross_entropy(x, w, y, 1.0, {4}).backward();
  EXPECT_LT(a.stats().allocated.peak - base, v * h * 4 / 2);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_TRUE(x.grad().defined());
}

TEST(LinearTokenLogprobs, MatchesFloat64ReferenceAndGradients) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t t = 23, h = 12, v = 37;
    Tensor x = randn({t, h}, dt, 23).set_requires_grad(true);
    Tensor w = randn({v, h}, dt, 24).set_requires_grad(true);
    Tensor y = make_targets(t, v, 25);
    Tensor lp = kernels::linear_token_logprobs(x, w, y, {5});
    EXPECT_EQ(lp.dtype(), DType::kF32);
    Tensor dlp = randn({t}, DType::kF32, 26);
    lp.backward(dlp);
    Vec g = dlp.to_f64(), coef(t);
    for (int64_t i = 0; i < t; ++i) coef[i] = -g[i];  // logp = -nll
    Ref r = reference(x.to_f64(), w.to_f64(), y.to_i64(), t, h, v, coef);
    Vec want(t);
    for (int64_t i = 0; i < t; ++i) want[i] = -r.nll[i];
    EXPECT_TRUE(near_ref(lp, want, 2e-5, 2e-5)) << dtype_name(dt);
    const double lim = dt == DType::kF32 ? 1e-5 : 4e-3;
    EXPECT_LT(rel_err(x.grad().to_f64(), r.dx), lim) << dtype_name(dt);
    EXPECT_LT(rel_err(w.grad().to_f64(), r.dw), lim) << dtype_name(dt);
  }
}

TEST(LinearTokenLogprobs, GradcheckFloat64) {
  Tensor y = make_targets(8, 6, 27);
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::linear_token_logprobs(in[0], in[1], y, {3})};
  };
  EXPECT_TRUE(
      testing::gradcheck(f, {randn({8, 5}, DType::kF64, 28), randn({6, 5}, DType::kF64, 29)}));
}

TEST(LinearCrossEntropyRows, PerRowNllAndCoefficientWeightedGradients) {
  const int64_t t = 17, h = 6, v = 29;
  Tensor x = randn({t, h}, DType::kF32, 30), w = randn({v, h}, DType::kF32, 31);
  Tensor y = make_targets(t, v, 32);
  Tensor coef = randn({t}, DType::kF32, 33);
  Guarded nll({t}, DType::kF32, Device::cpu()), dx({t, h}, DType::kF32, Device::cpu());
  Tensor dw = Tensor::full({v, h}, 0.5, DType::kF32);
  kernels::linear_cross_entropy_rows(x, w, y, coef, nll.payload(), dx.payload(), dw, {4});
  EXPECT_TRUE(nll.check());
  EXPECT_TRUE(dx.check());
  Ref r = reference(x.to_f64(), w.to_f64(), y.to_i64(), t, h, v, coef.to_f64());
  EXPECT_TRUE(near_ref(nll.payload(), r.nll, 2e-6, 2e-5));
  for (double& e : r.dw) e += 0.5;
  EXPECT_LT(rel_err(dx.payload().to_f64(), r.dx), 1e-5);
  EXPECT_LT(rel_err(dw.to_f64(), r.dw), 1e-5);
  // Gradients need coefficients.
  EXPECT_THROW(
      kernels::linear_cross_entropy_rows(x, w, y, Tensor(), Tensor(), dx.payload(), Tensor(), {4}),
      Error);
}

// The CUDA path stores G = softmax - onehot in the logits dtype between its GEMMs. This replays
// that storage for an f16 model with the very functions the kernel and its launcher use
// (kernels/linear_cross_entropy_grad.h): p formed in f32, the G entry rounded once to f16, the
// GEMM in f32 with alpha = linear_ce_gemm_alpha(grad_scale). At grad_scale = 2^-14 and a 151936
// vocabulary, folding the scale into the stored entry (the former scheme, replayed alongside to
// show the test can fail) flushes almost every non-target entry to zero, so the dW rows of the
// classes no row targets lose their whole gradient.
TEST(LinearCrossEntropyGradStorage, F16KeepsNonTargetMassAtTinyGradScale) {
  const int64_t t = 3, h = 4, v = 151936;
  const double grad_scale = 1.0 / 16384;
  Generator g(21, RngPurpose::kTest);
  std::vector<float> z(static_cast<size_t>(t * v));
  const Vec zn = randn({t, v}, DType::kF64, 22).to_f64();
  const Vec x = randn({t, h}, DType::kF64, 23).to_f64();
  for (size_t i = 0; i < z.size(); ++i) z[i] = static_cast<float>(1.5 * zn[i]);
  std::vector<int64_t> y(static_cast<size_t>(t));
  for (int64_t r = 0; r < t; ++r) y[r] = static_cast<int64_t>(g.next_below(v));
  auto round_f16 = [](double a) {
    return static_cast<double>(f16_to_f32(f32_to_f16(static_cast<float>(a))));
  };
  // dW[j, :] for the classes j no row targets: exact (f64), as stored now, as formerly stored.
  Vec ref, now, before;
  for (int64_t j = 0; j < v; ++j) {
    bool targeted = false;
    for (int64_t r = 0; r < t; ++r) targeted = targeted || y[r] == j;
    if (targeted) continue;
    for (int64_t c = 0; c < h; ++c) {
      ref.push_back(0);
      now.push_back(0);
      before.push_back(0);
    }
  }
  for (int64_t r = 0; r < t; ++r) {
    const float* zr = z.data() + r * v;
    double m = -INFINITY, se = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(zr[j]));
    for (int64_t j = 0; j < v; ++j) se += std::exp(zr[j] - m);
    const double lse = m + std::log(se);
    size_t k = 0;
    for (int64_t j = 0; j < v; ++j) {
      const bool is_target = j == y[r];
      bool targeted = false;
      for (int64_t q = 0; q < t; ++q) targeted = targeted || y[q] == j;
      const float p = std::exp(static_cast<float>(zr[j] - lse));
      const double g_exact = (std::exp(zr[j] - lse) - (is_target ? 1.0 : 0.0)) * grad_scale;
      const double g_now = round_f16(kernels::linear_ce_grad_entry(p, is_target)) *
                           kernels::linear_ce_gemm_alpha(grad_scale);
      const double g_before = round_f16(kernels::linear_ce_grad_entry(p, is_target) * grad_scale);
      if (targeted) continue;
      for (int64_t c = 0; c < h; ++c, ++k) {
        ref[k] += g_exact * x[r * h + c];
        now[k] += g_now * x[r * h + c];
        before[k] += g_before * x[r * h + c];
      }
    }
  }
  EXPECT_LT(rel_err(now, ref), 0.02);
  EXPECT_GT(rel_err(before, ref), 0.5);
}

}  // namespace
}  // namespace leantune
