// GPU tier for linear_cross_entropy (kernels/linear_cross_entropy.cu) against the CPU op on host
// copies of the same fresh random inputs: loss, dhidden (overwritten, 0 on ignored rows) and
// dweight (accumulated into), for bf16 / f16 (logits stored in the input dtype: bf16-level
// tolerances), f32 and f64; one and many chunks, chunks whose valid rows are consecutive (used in
// place) or not (gathered), targets 0 and V-1, ignored rows, all rows ignored, host and device
// targets, dweight in another dtype or not contiguous, only one of the gradients, no gradients,
// a bad target, guard bands, the autograd op, and peak extra device memory that does not grow
// with the number of tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear_cross_entropy.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::Guarded;

const Device kGpu = Device::cuda(0);

struct Case {
  DType dt;
  int64_t t, h, v, chunk;
  int ignore_every;  // every n-th row ignored (0: none)
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  const Case& c = p.param;
  return std::string(dtype_name(c.dt)) + "_T" + std::to_string(c.t) + "_H" + std::to_string(c.h) +
         "_V" + std::to_string(c.v) + "_C" + std::to_string(c.chunk) + "_ign" +
         std::to_string(c.ignore_every);
}

// Targets cycling through 0, V-1 and pseudo-random ids; every `ignore_every`-th row ignored.
Tensor make_targets(int64_t t, int64_t v, int ignore_every, DType dt = DType::kI64) {
  std::vector<int64_t> y(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    if (ignore_every > 0 && i % ignore_every == ignore_every - 1)
      y[i] = kernels::kIgnoreIndex;
    else if (i % 5 == 0)
      y[i] = 0;
    else if (i % 5 == 1)
      y[i] = v - 1;
    else
      y[i] = (i * 7919 + 13) % v;
  }
  Tensor out = Tensor::from_vector(y, {t});
  return dt == DType::kI64 ? out : out.to(dt);
}

// ||a - b|| / max(||b||, tiny): NaN when either holds a NaN (and then the check fails).
double rel_fro(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_f64(), y = b.to_f64();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

double grad_tol(DType dt) {
  switch (dt) {
    case DType::kF64:
      return 1e-11;
    case DType::kF32:
      return 2e-5;
    default:
      return 1.5e-2;  // 16-bit logits and G: a few bf16 ulps in relative Frobenius terms
  }
}

double loss_tol(DType dt, double loss, int64_t n) {
  switch (dt) {
    case DType::kF64:
      return 1e-9 * (std::abs(loss) + 1);
    case DType::kF32:
      return 1e-5 * (std::abs(loss) + 1);
    default:
      return 3e-3 * std::abs(loss) + 1e-2 * std::sqrt(static_cast<double>(n) + 1);
  }
}

int64_t count_valid(const Tensor& y) {
  int64_t n = 0;
  for (int64_t v : y.to_i64()) n += v != kernels::kIgnoreIndex;
  return n;
}

DType grad_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

class LinearCrossEntropyCuda : public ::testing::TestWithParam<Case> {};

TEST_P(LinearCrossEntropyCuda, LossAndGradientsMatchCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  const Tensor x = testing::randn({c.t, c.h}, c.dt, 801);
  const Tensor w = testing::randn({c.v, c.h}, c.dt, 802, Device::cpu(), 0.08);
  const Tensor dw0 = testing::randn({c.v, c.h}, grad_dtype(c.dt), 803, Device::cpu(), 0.01);
  const Tensor y = make_targets(c.t, c.v, c.ignore_every);
  const double scale = 0.37;
  kernels::LinearCrossEntropyOptions opt;
  opt.chunk_tokens = c.chunk;

  Tensor dh_ref = Tensor::empty({c.t, c.h}, c.dt), dw_ref = dw0.clone();
  const double loss_ref =
      kernels::linear_cross_entropy_fwd_bwd(x, w, y, scale, dh_ref, dw_ref, opt);

  const Tensor xd = x.to(kGpu), wd = w.to(kGpu);
  for (bool device_targets : {false, true}) {
    Guarded dh({c.t, c.h}, c.dt, kGpu);
    dh.payload().fill_(7.0);  // ignored rows must be zeroed, not left alone
    Guarded dw({c.v, c.h}, grad_dtype(c.dt), kGpu);
    dw.payload().copy_(dw0);
    const double loss = kernels::linear_cross_entropy_fwd_bwd_cuda(
        xd, wd, device_targets ? y.to(kGpu) : y, scale, dh.payload(), dw.payload(), opt);
    EXPECT_TRUE(dh.check());
    EXPECT_TRUE(dw.check());
    EXPECT_NEAR(loss, loss_ref, loss_tol(c.dt, loss_ref, count_valid(y)));
    EXPECT_LE(rel_fro(dh.payload(), dh_ref), grad_tol(c.dt)) << "dhidden";
    // The accumulated part alone (dw - dw0) carries the comparison.
    const Tensor got = ops::sub(dw.payload().to(Device::cpu()), dw0);
    const Tensor want = ops::sub(dw_ref, dw0);
    EXPECT_LE(rel_fro(got, want), grad_tol(c.dt)) << "dweight";
    // Ignored rows exactly zero.
    const std::vector<int64_t> yy = y.to_i64();
    const std::vector<double> dhv = dh.payload().to_f64();
    for (int64_t i = 0; i < c.t; ++i) {
      if (yy[i] != kernels::kIgnoreIndex) continue;
      for (int64_t j = 0; j < c.h; ++j) {
        ASSERT_EQ(dhv[i * c.h + j], 0.0) << "row " << i;
      }
    }
  }
}

TEST_P(LinearCrossEntropyCuda, PartialGradientsAndLossOnly) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  const Tensor x = testing::randn({c.t, c.h}, c.dt, 811);
  const Tensor w = testing::randn({c.v, c.h}, c.dt, 812, Device::cpu(), 0.08);
  const Tensor y = make_targets(c.t, c.v, c.ignore_every, DType::kI32);
  kernels::LinearCrossEntropyOptions opt;
  opt.chunk_tokens = c.chunk;
  Tensor dh_ref = Tensor::empty({c.t, c.h}, c.dt);
  Tensor dw_ref = Tensor::zeros({c.v, c.h}, grad_dtype(c.dt));
  const double loss_ref = kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dh_ref, dw_ref, opt);
  const Tensor xd = x.to(kGpu), wd = w.to(kGpu);
  const double tol = loss_tol(c.dt, loss_ref, count_valid(y));
  // Loss only.
  EXPECT_NEAR(kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, Tensor(), Tensor(), opt),
              loss_ref, tol);
  // dhidden only.
  Tensor dh = Tensor::empty({c.t, c.h}, c.dt, kGpu);
  EXPECT_NEAR(kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, dh, Tensor(), opt),
              loss_ref, tol);
  EXPECT_LE(rel_fro(dh, dh_ref), grad_tol(c.dt));
  // dweight only, in the input dtype (accumulated in place, rounded once per chunk of valid rows:
  // the error grows about as the square root of the number of chunks) and as a non-contiguous
  // view.
  if (c.dt != DType::kF64) {
    Tensor dw16 = Tensor::zeros({c.v, c.h}, c.dt, kGpu);
    kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, Tensor(), dw16, opt);
    const double chunks = static_cast<double>((count_valid(y) + c.chunk - 1) / c.chunk);
    EXPECT_LE(rel_fro(dw16, dw_ref),
              grad_tol(c.dt) + (c.dt == DType::kF32 ? 0 : 4e-3 * std::sqrt(std::max(chunks, 1.0))));
  }
  Tensor base = Tensor::zeros({c.h, c.v}, grad_dtype(c.dt), kGpu);
  Tensor dwt = base.transpose(0, 1);  // [V, H], not contiguous
  kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, Tensor(), dwt, opt);
  EXPECT_LE(rel_fro(dwt, dw_ref), grad_tol(c.dt));
  // dhidden in f32 for 16-bit inputs.
  if (c.dt == DType::kBF16 || c.dt == DType::kF16) {
    Tensor dh32 = Tensor::empty({c.t, c.h}, DType::kF32, kGpu);
    kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, dh32, Tensor(), opt);
    EXPECT_LE(rel_fro(dh32, dh_ref.to(DType::kF32)), grad_tol(c.dt));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearCrossEntropyCuda,
                         ::testing::Values(Case{DType::kBF16, 1, 8, 5, 1024, 0},
                                           Case{DType::kF32, 19, 32, 229, 7, 3},
                                           Case{DType::kBF16, 71, 64, 1001, 16, 3},
                                           Case{DType::kBF16, 300, 128, 4096, 1024, 0},
                                           Case{DType::kBF16, 257, 96, 2053, 64, 4},
                                           Case{DType::kF16, 65, 64, 512, 32, 2},
                                           Case{DType::kF32, 130, 64, 3000, 64, 0},
                                           Case{DType::kF64, 23, 16, 97, 5, 3},
                                           Case{DType::kBF16, 40, 256, 151936, 1 << 20, 5}),
                         case_name);

// Gemma's final logit soft-capping inside the chunks: loss and gradients against the CPU path.
TEST(LinearCrossEntropyCudaSoftcap, LossAndGradientsMatchCpu) {
  LT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t t = 71, h = 64, v = 1000;
    Tensor x = testing::randn({t, h}, dt, 501, Device::cpu(), 2.0);
    Tensor w = testing::randn({v, h}, dt, 502, Device::cpu(), 0.5);
    std::vector<int64_t> tg(t);
    for (int64_t i = 0; i < t; ++i) tg[i] = i % 5 == 0 ? -100 : (i * 37) % v;
    const Tensor y = Tensor::from_vector(tg, {t});
    kernels::LinearCrossEntropyOptions lo;
    lo.chunk_tokens = 16;
    lo.softcap = 3.0;
    Tensor xh = x.clone().set_requires_grad(true), wh = w.clone().set_requires_grad(true);
    Tensor xd = x.to(kGpu).set_requires_grad(true), wd = w.to(kGpu).set_requires_grad(true);
    Tensor lh = kernels::linear_cross_entropy(xh, wh, y, 7.0, lo);
    Tensor ld = kernels::linear_cross_entropy(xd, wd, y.to(kGpu), 7.0, lo);
    lh.backward();
    ld.backward();
    const double tol = dt == DType::kF32 ? 1e-5 : 2e-2;
    EXPECT_NEAR(ld.item(), lh.item(), tol * (1 + std::abs(lh.item()))) << dtype_name(dt);
    EXPECT_TRUE(testing::all_close(xd.grad(), xh.grad(), tol * 0.1, tol * 10)) << dtype_name(dt);
    EXPECT_TRUE(testing::all_close(wd.grad(), wh.grad(), tol * 0.1, tol * 10)) << dtype_name(dt);
  }
}

TEST(LinearCrossEntropyCudaEdge, AllIgnoredGivesZeroLossAndGradients) {
  LT_SKIP_WITHOUT_CUDA();
  const int64_t t = 9, h = 32, v = 100;
  const Tensor xd = testing::randn({t, h}, DType::kBF16, 821, kGpu);
  const Tensor wd = testing::randn({v, h}, DType::kBF16, 822, kGpu);
  const Tensor y = Tensor::full({t}, static_cast<double>(kernels::kIgnoreIndex), DType::kI64);
  Tensor dh = Tensor::full({t, h}, 3.0, DType::kBF16, kGpu);
  Tensor dw = Tensor::full({v, h}, 0.5, DType::kF32, kGpu);
  const double loss = kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, dh, dw, {});
  EXPECT_EQ(loss, 0.0);
  for (double e : dh.to_f64()) ASSERT_EQ(e, 0.0);
  for (double e : dw.to_f64()) ASSERT_EQ(e, 0.5);
}

TEST(LinearCrossEntropyCudaEdge, BadTargetThrowsBeforeAnyWork) {
  LT_SKIP_WITHOUT_CUDA();
  const int64_t t = 6, h = 16, v = 50;
  const Tensor xd = testing::randn({t, h}, DType::kBF16, 831, kGpu);
  const Tensor wd = testing::randn({v, h}, DType::kBF16, 832, kGpu);
  std::vector<int64_t> yy = {1, 2, kernels::kIgnoreIndex, v, 3, 4};
  const Tensor y = Tensor::from_vector(yy, {t});
  Tensor dw = Tensor::full({v, h}, 0.25, DType::kF32, kGpu);
  EXPECT_THROW(kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, Tensor(), dw, {}), Error);
  EXPECT_THROW(
      kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y.to(kGpu), 1.0, Tensor(), dw, {}), Error);
  for (double e : dw.to_f64()) ASSERT_EQ(e, 0.25);
}

TEST(LinearCrossEntropyCudaEdge, ChunkingDoesNotChangeTheResultBeyondRounding) {
  LT_SKIP_WITHOUT_CUDA();
  const int64_t t = 333, h = 64, v = 777;
  const Tensor xd = testing::randn({t, h}, DType::kF32, 841, kGpu);
  const Tensor wd = testing::randn({v, h}, DType::kF32, 842, kGpu, 0.1);
  const Tensor y = make_targets(t, v, 4);
  Tensor dh1 = Tensor::empty({t, h}, DType::kF32, kGpu),
         dw1 = Tensor::zeros({v, h}, DType::kF32, kGpu);
  Tensor dh2 = Tensor::empty({t, h}, DType::kF32, kGpu),
         dw2 = Tensor::zeros({v, h}, DType::kF32, kGpu);
  const double l1 = kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, dh1, dw1, {1 << 20});
  const double l2 = kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, dh2, dw2, {13});
  EXPECT_NEAR(l1, l2, 1e-9 * std::abs(l1));  // same rows, same per-row math, same summation
  EXPECT_LE(rel_fro(dh1, dh2), 1e-6);
  EXPECT_LE(rel_fro(dw1, dw2), 1e-5);
}

TEST(LinearCrossEntropyCudaAutograd, LossAndGradsMatchCpuNode) {
  LT_SKIP_WITHOUT_CUDA();
  const int64_t t = 47, h = 64, v = 503;
  const Tensor x = testing::randn({t, h}, DType::kBF16, 851);
  const Tensor w = testing::randn({v, h}, DType::kBF16, 852, Device::cpu(), 0.08);
  const Tensor y = make_targets(t, v, 3);
  const double norm = 40.0;
  Tensor xh = x.clone().set_requires_grad(true), wh = w.clone().set_requires_grad(true);
  Tensor xg = x.to(kGpu).set_requires_grad(true), wg = w.to(kGpu).set_requires_grad(true);
  Tensor lh = kernels::linear_cross_entropy(xh, wh, y, norm);
  Tensor lg = kernels::linear_cross_entropy(xg, wg, y.to(kGpu), norm);
  EXPECT_NEAR(lg.item(), lh.item(), 3e-3 * std::abs(lh.item()) + 1e-3);
  lh.backward();
  lg.backward();
  EXPECT_LE(rel_fro(xg.grad(), xh.grad()), 1.5e-2);
  EXPECT_LE(rel_fro(wg.grad(), wh.grad()), 1.5e-2);
}

// Peak device memory above what the caller holds, for T tokens (a third of them ignored, so rows
// are gathered), with the chunk fixed: must not grow with T beyond the 12 bytes per valid row of
// the row list, targets and per-row losses.
int64_t peak_extra_bytes(int64_t t, int64_t h, int64_t v, int64_t chunk,
                         DType dw_dtype = DType::kF32) {
  Allocator& alloc = allocator(kGpu);
  const Tensor xd = testing::randn({t, h}, DType::kBF16, 861, kGpu);
  const Tensor wd = testing::randn({v, h}, DType::kBF16, 862, kGpu, 0.05);
  const Tensor y = make_targets(t, v, 3);
  Tensor dh = Tensor::empty({t, h}, DType::kBF16, kGpu);
  Tensor dw = Tensor::zeros({v, h}, dw_dtype, kGpu);
  device_synchronize(kGpu);
  const int64_t base = alloc.stats().allocated.current;
  alloc.reset_peak_stats();
  kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, dh, dw, {chunk});
  device_synchronize(kGpu);
  return alloc.stats().allocated.peak - base;
}

TEST(LinearCrossEntropyCudaMemory, PeakExtraDoesNotGrowWithTokens) {
  LT_SKIP_WITHOUT_CUDA();
  // Every third row ignored: 2/3 of T valid, a whole number of full chunks in both runs (the
  // same GEMM shapes, so the same cuBLASLt workspaces).
  const int64_t h = 256, v = 32000, chunk = 512, t_small = 3072, t_large = 15360;
  const int64_t small = peak_extra_bytes(t_small, h, v, chunk);
  const int64_t large = peak_extra_bytes(t_large, h, v, chunk);
  // The chunk's logits dominate: chunk x V bf16 (31 MiB), far below T x V.
  EXPECT_GT(small, 0);
  EXPECT_LE(large - small, (t_large - t_small) * 2 / 3 * 12 + (int64_t{1} << 20))
      << "small " << small << " large " << large;
  EXPECT_LT(large, t_large * v * 2 / 8) << "extra memory is a sizeable part of the full logits";
}

TEST(LinearCrossEntropyCudaMemory, Bf16HeadGradientIsAccumulatedInPlace) {
  LT_SKIP_WITHOUT_CUDA();
  // The head's gradient as linear_cross_entropy holds it (bf16, the weight's dtype): cuBLASLt adds
  // each chunk into it directly. An f32 accumulator would be V x H x 4 = 125 MiB; the extra here
  // is the chunk's logits (8 MiB), gathered rows and cuBLASLt's workspace (<= 32 MiB).
  const int64_t h = 1024, v = 32000;
  const int64_t extra = peak_extra_bytes(768, h, v, 128, DType::kBF16);
  EXPECT_GT(extra, 0);
  EXPECT_LT(extra, v * h * 2) << extra;
}

}  // namespace
}  // namespace leantune
