#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "engine/allocator.h"
#include "kernel_test_util.h"
#include "kernels/residual.h"
#include "kernels/rms_norm.h"
#include "kernels/stat_dtype.h"

namespace leantune {
namespace {

using kernel_test::near_ref;
using kernel_test::round_to;
using kernel_test::scaled_tol;
using kernel_test::Vec;
using testing::Guarded;
using testing::randn;

struct RmsCase {
  DType dt;
  int64_t t, h;
  bool offset = false;  // Gemma's (1 + w)
};

std::string rms_name(const ::testing::TestParamInfo<RmsCase>& p) {
  return std::string(dtype_name(p.param.dt)) + "_T" + std::to_string(p.param.t) + "_H" +
         std::to_string(p.param.h) + (p.param.offset ? "_unit_offset" : "");
}

constexpr double kEps = 1e-6;

DType stat(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

struct RmsRef {
  Vec y, rstd, dx, dw;
};

// Exact float64 math on the given (rounded) values; dw uses the unrounded x*rstd. With `offset`
// the weight acts as 1 + w.
RmsRef reference(const Vec& x, const Vec& w0, const Vec& dy, int64_t t, int64_t h,
                 bool offset = false) {
  Vec w = w0;
  if (offset)
    for (double& v : w) v += 1.0;
  RmsRef r{Vec(x.size()), Vec(t), Vec(x.size()), Vec(h, 0.0)};
  for (int64_t i = 0; i < t; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += x[i * h + j] * x[i * h + j];
    const double rs = 1.0 / std::sqrt(ss / h + kEps);
    r.rstd[i] = rs;
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) {
      const double xh = x[i * h + j] * rs;
      r.y[i * h + j] = w[j] * xh;
      r.dw[j] += dy[i * h + j] * xh;
      dot += dy[i * h + j] * w[j] * xh;
    }
    for (int64_t j = 0; j < h; ++j)
      r.dx[i * h + j] = rs * (dy[i * h + j] * w[j] - x[i * h + j] * rs * dot / h);
  }
  return r;
}

class RmsNormTest : public ::testing::TestWithParam<RmsCase> {};

TEST_P(RmsNormTest, ForwardMatchesFloat64Reference) {
  const RmsCase c = GetParam();
  Tensor x = randn({c.t, c.h}, c.dt, 1, Device::cpu(), 2.0);
  Tensor w = randn({c.h}, c.dt, 2);
  Guarded y({c.t, c.h}, c.dt, Device::cpu()), rstd({c.t}, stat(c.dt), Device::cpu());
  kernels::rms_norm_fwd(x, w, kEps, y.payload(), rstd.payload(), c.offset);
  EXPECT_TRUE(y.check());
  EXPECT_TRUE(rstd.check());
  Vec xv = x.to_f64(), wv = w.to_f64();
  RmsRef r = reference(xv, wv, Vec(xv.size(), 0.0), c.t, c.h, c.offset);
  EXPECT_TRUE(near_ref(rstd.payload(), r.rstd, testing::tol(stat(c.dt))));
  // Two roundings for 16-bit types (x*rstd, then the product), each within half an ulp.
  testing::Tol t = testing::tol(c.dt);
  if (c.dt == DType::kBF16) t.rtol = 2.0 / 128;
  EXPECT_TRUE(near_ref(y.payload(), r.y, t));
  // Hugging Face's order of roundings reproduced in double: w * round(x * rstd), rounded.
  if (c.dt == DType::kBF16 && !c.offset) {
    Vec hf(xv.size());
    for (int64_t i = 0; i < c.t; ++i)
      for (int64_t j = 0; j < c.h; ++j) {
        const float rs = static_cast<float>(r.rstd[i]);
        const double xh = round_to(static_cast<float>(xv[i * c.h + j]) * rs, c.dt);
        hf[i * c.h + j] = round_to(wv[j] * xh, c.dt);
      }
    // Only f32 rounding of the sum of squares differs: at most one bf16 ulp anywhere.
    EXPECT_TRUE(near_ref(y.payload(), hf, 0.0, 1.0 / 128));
  }
}

TEST_P(RmsNormTest, BackwardMatchesFloat64Reference) {
  const RmsCase c = GetParam();
  Tensor x = randn({c.t, c.h}, c.dt, 3, Device::cpu(), 2.0);
  Tensor w = randn({c.h}, c.dt, 4);
  Tensor dy = randn({c.t, c.h}, c.dt, 5);
  Tensor y = Tensor::empty({c.t, c.h}, c.dt), rstd = Tensor::empty({c.t}, stat(c.dt));
  kernels::rms_norm_fwd(x, w, kEps, y, rstd, c.offset);
  Guarded dx({c.t, c.h}, c.dt, Device::cpu()), dw({c.h}, c.dt, Device::cpu());
  kernels::rms_norm_bwd(dy, x, w, rstd, dx.payload(), dw.payload(), c.offset);
  EXPECT_TRUE(dx.check());
  EXPECT_TRUE(dw.check());
  RmsRef r = reference(x.to_f64(), w.to_f64(), dy.to_f64(), c.t, c.h, c.offset);
  EXPECT_TRUE(near_ref(dx.payload(), r.dx, scaled_tol(c.dt, kernel_test::max_abs(r.dx))));
  EXPECT_TRUE(near_ref(dw.payload(), r.dw, scaled_tol(c.dt, std::sqrt(double(c.t)))));
}

TEST_P(RmsNormTest, AutogradMatchesRawBackwardAndFrozenWeightGetsNone) {
  const RmsCase c = GetParam();
  Tensor x = randn({c.t, c.h}, c.dt, 6).set_requires_grad(true);
  Tensor w = randn({c.h}, c.dt, 7).set_requires_grad(true);
  Tensor dy = randn({c.t, c.h}, c.dt, 8);
  kernels::rms_norm(x, w, kEps, c.offset).backward(dy);
  Tensor y = Tensor::empty({c.t, c.h}, c.dt), rstd = Tensor::empty({c.t}, stat(c.dt));
  kernels::rms_norm_fwd(x.detach(), w.detach(), kEps, y, rstd, c.offset);
  Tensor dx = Tensor::empty({c.t, c.h}, c.dt), dw = Tensor::empty({c.h}, c.dt);
  kernels::rms_norm_bwd(dy, x.detach(), w.detach(), rstd, dx, dw, c.offset);
  EXPECT_TRUE(testing::all_close(x.grad(), dx, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(w.grad(), dw, 0.0, 0.0));

  Tensor x2 = x.detach().clone().set_requires_grad(true);
  Tensor w2 = w.detach();
  kernels::rms_norm(x2, w2, kEps, c.offset).backward(dy);
  EXPECT_TRUE(testing::all_close(x2.grad(), dx, 0.0, 0.0));
  EXPECT_FALSE(w2.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RmsNormTest,
    ::testing::Values(RmsCase{DType::kF32, 1, 1}, RmsCase{DType::kF32, 19, 19},
                      RmsCase{DType::kF32, 71, 229}, RmsCase{DType::kBF16, 71, 229},
                      RmsCase{DType::kF16, 19, 64}, RmsCase{DType::kF64, 40, 8},
                      RmsCase{DType::kF32, 1, 1, true}, RmsCase{DType::kF32, 71, 229, true},
                      RmsCase{DType::kBF16, 71, 229, true}, RmsCase{DType::kF64, 40, 8, true}),
    rms_name);

TEST(RmsNorm, GradcheckFloat64) {
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::rms_norm(in[0], in[1], kEps)};
  };
  EXPECT_TRUE(testing::gradcheck(f, {randn({5, 7}, DType::kF64, 9), randn({7}, DType::kF64, 10)}));
  // More rows than one backward block, so several dw partials are summed.
  EXPECT_TRUE(
      testing::gradcheck(f, {randn({70, 3}, DType::kF64, 11), randn({3}, DType::kF64, 12)}));
  auto g = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::rms_norm(in[0], in[1], kEps, /*unit_offset=*/true)};
  };
  EXPECT_TRUE(testing::gradcheck(g, {randn({5, 7}, DType::kF64, 13), randn({7}, DType::kF64, 14)}));
  EXPECT_TRUE(
      testing::gradcheck(g, {randn({70, 3}, DType::kF64, 15), randn({3}, DType::kF64, 16)}));
}

TEST(RmsNorm, ThreeDimensionalInputNormalisesTheLastAxis) {
  Tensor x = randn({2, 3, 8}, DType::kF32, 13);
  Tensor w = randn({8}, DType::kF32, 14);
  Tensor a = kernels::rms_norm(x, w, kEps);
  Tensor b = kernels::rms_norm(x.reshape({6, 8}), w, kEps);
  EXPECT_EQ(a.shape(), x.shape());
  EXPECT_TRUE(testing::all_close(a.reshape({6, 8}), b, 0.0, 0.0));
}

TEST(RmsNorm, ZeroRowGivesZeroOutputAndNanRowStaysNan) {
  Vec xv(8, 0.0);
  for (int j = 4; j < 8; ++j) xv[j] = std::nan("");
  Tensor x = kernel_test::make(xv, {2, 4}, DType::kF32);
  Tensor y = kernels::rms_norm(x, Tensor::full({4}, 1.0, DType::kF32), kEps);
  Vec yv = y.to_f64();
  for (int j = 0; j < 4; ++j) EXPECT_EQ(yv[j], 0.0);
  for (int j = 4; j < 8; ++j) EXPECT_TRUE(std::isnan(yv[j]));
}

TEST(RmsNorm, MismatchedWeightIsAnError) {
  EXPECT_THROW(kernels::rms_norm(randn({3, 4}, DType::kF32, 1), randn({5}, DType::kF32, 2), kEps),
               Error);
}

// add_rms_norm: the sum and y equal residual_add then rms_norm, and so do the gradients of a, b
// and w through both outputs and through y alone, element for element (on the CPU the fused op
// is that composition; the CUDA kernel is held to the same by the op table's add_rms_norm rows).
class AddRmsNormTest : public ::testing::TestWithParam<RmsCase> {};
TEST_P(AddRmsNormTest, EqualsResidualAddThenRmsNorm) {
  const RmsCase c = GetParam();
  const Tensor a0 = randn({c.t, c.h}, c.dt, 41), b0 = randn({c.t, c.h}, c.dt, 42);
  const Tensor w0 = randn({c.h}, c.dt, 43);
  const Tensor ds = randn({c.t, c.h}, c.dt, 44), dy = randn({c.t, c.h}, c.dt, 45);
  // Gradients through both outputs, through y alone, and with a and b frozen (w's gradient alone
  // wanted, as when only a later norm trains: the sum then needs no gradient, as residual_add's).
  for (const int mode : {0, 1, 2}) {
    const bool both = mode != 1, frozen = mode == 2;
    std::vector<std::vector<double>> got[2];
    for (const bool fused : {true, false}) {
      Tensor a = a0.clone().set_requires_grad(!frozen), b = b0.clone().set_requires_grad(!frozen);
      Tensor w = w0.clone().set_requires_grad(true);
      kernels::AddRmsNormOutput o;
      if (fused) {
        o = kernels::add_rms_norm(a, b, w, kEps, c.offset);
      } else {
        o.sum = kernels::residual_add(a, b);
        o.y = kernels::rms_norm(o.sum, w, kEps, c.offset);
      }
      EXPECT_EQ(o.sum.requires_grad(), !frozen);
      if (both && !frozen)
        backward({o.sum, o.y}, {ds, dy});
      else
        backward({o.y}, {dy});
      for (const Tensor& t : {o.sum, o.y, a.grad(), b.grad(), w.grad()})
        got[fused].push_back(t.defined() ? t.to_f64() : std::vector<double>{});
    }
    const char* names[] = {"sum", "y", "da", "db", "dw"};
    for (int i = 0; i < 5; ++i) EXPECT_EQ(got[1][i], got[0][i]) << names[i] << " mode " << mode;
    EXPECT_EQ(got[1][2].empty(), frozen);
    EXPECT_FALSE(got[1][4].empty());
  }
}
INSTANTIATE_TEST_SUITE_P(Cases, AddRmsNormTest,
                         ::testing::Values(RmsCase{DType::kF32, 1, 1},
                                           RmsCase{DType::kBF16, 19, 19},
                                           RmsCase{DType::kF16, 71, 229},
                                           RmsCase{DType::kBF16, 71, 229, true},
                                           RmsCase{DType::kF64, 40, 8}),
                         rms_name);

// b handed over (moved in, nothing else holding it): y is written into b's storage, one output
// is allocated instead of two, and everything equals the call that keeps b.
TEST(AddRmsNorm, AHandedOverSummandTakesTheNorm) {
  const Tensor a = randn({37, 96}, DType::kBF16, 71), w = randn({96}, DType::kBF16, 72);
  const Tensor b0 = randn({37, 96}, DType::kBF16, 73);
  const kernels::AddRmsNormOutput kept = kernels::add_rms_norm(a, b0, w, kEps);
  EXPECT_NE(kept.y.data_ptr(), b0.data_ptr());
  Tensor b = b0.clone();
  const void* storage = b.data_ptr();
  const int64_t before = allocator(Device::cpu()).stats().allocated.current;
  const kernels::AddRmsNormOutput handed = kernels::add_rms_norm(a, std::move(b), w, kEps);
  const int64_t held = allocator(Device::cpu()).stats().allocated.current - before;
  EXPECT_EQ(handed.y.data_ptr(), storage);
  EXPECT_LT(held, 2 * 37 * 96 * 2);  // the sum and rstd, not a second [37, 96] output
  EXPECT_EQ(handed.sum.to_f64(), kept.sum.to_f64());
  EXPECT_EQ(handed.y.to_f64(), kept.y.to_f64());
}

// dx may share dres's storage: each element of dres is read before dx's is written.
TEST(RmsNorm, BackwardDxMayShareTheResidualGradientsStorage) {
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor x = randn({19, 71}, dt, 81), w = randn({71}, dt, 82), dy = randn({19, 71}, dt, 83);
    const Tensor dres = randn({19, 71}, dt, 84);
    const Tensor y = Tensor::empty({19, 71}, dt),
                 rstd = Tensor::empty({19}, kernels::stat_dtype(dt));
    kernels::rms_norm_fwd(x, w, kEps, y, rstd);
    const Tensor dx = Tensor::empty({19, 71}, dt), shared = dres.clone();
    kernels::rms_norm_bwd(dy, x, w, rstd, dx, Tensor(), false, dres);
    kernels::rms_norm_bwd(dy, x, w, rstd, shared, Tensor(), false, shared);
    EXPECT_EQ(shared.to_f64(), dx.to_f64()) << dtype_name(dt);
  }
}

TEST(AddRmsNorm, GradcheckFloat64) {
  for (const bool offset : {false, true}) {
    auto f = [offset](const std::vector<Tensor>& in) {
      const kernels::AddRmsNormOutput o = kernels::add_rms_norm(in[0], in[1], in[2], kEps, offset);
      return std::vector<Tensor>{o.sum, o.y};
    };
    EXPECT_TRUE(
        testing::gradcheck(f, {randn({5, 7}, DType::kF64, 51), randn({5, 7}, DType::kF64, 52),
                               randn({7}, DType::kF64, 53)}));
    EXPECT_TRUE(
        testing::gradcheck(f, {randn({70, 3}, DType::kF64, 54), randn({70, 3}, DType::kF64, 55),
                               randn({3}, DType::kF64, 56)}));
  }
}

TEST(AddRmsNorm, MismatchedShapesAreAnError) {
  const Tensor a = randn({4, 8}, DType::kF32, 61), w = randn({8}, DType::kF32, 62);
  EXPECT_THROW(kernels::add_rms_norm(a, randn({4, 7}, DType::kF32, 63), w, kEps), Error);
  EXPECT_THROW(kernels::add_rms_norm(a, randn({4, 8}, DType::kBF16, 64), w, kEps), Error);
  EXPECT_THROW(kernels::add_rms_norm(a, a, randn({7}, DType::kF32, 65), kEps), Error);
}

}  // namespace
}  // namespace leantune
