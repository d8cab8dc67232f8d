#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/swiglu.h"

namespace leantune {
namespace {

using kernel_test::max_err;
using kernel_test::near_ref;
using kernel_test::round_all;
using kernel_test::Vec;
using testing::Guarded;
using testing::randn;

struct SwiCase {
  DType dt;
  int64_t t, i;
};

std::string swi_name(const ::testing::TestParamInfo<SwiCase>& p) {
  return std::string(dtype_name(p.param.dt)) + "_T" + std::to_string(p.param.t) + "_I" +
         std::to_string(p.param.i);
}

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

class SwigluTest : public ::testing::TestWithParam<SwiCase> {};

TEST_P(SwigluTest, ForwardMatchesFloat64ReferenceAndBeatsNaiveRounding) {
  const SwiCase c = GetParam();
  Tensor g = randn({c.t, c.i}, c.dt, 1, Device::cpu(), 3.0), u = randn({c.t, c.i}, c.dt, 2);
  Guarded y({c.t, c.i}, c.dt, Device::cpu());
  kernels::swiglu_fwd(g, u, y.payload());
  EXPECT_TRUE(y.check());
  Vec gv = g.to_f64(), uv = u.to_f64(), ref(gv.size()), silu(gv.size());
  for (size_t k = 0; k < gv.size(); ++k) {
    silu[k] = gv[k] * sig(gv[k]);
    ref[k] = silu[k] * uv[k];
  }
  EXPECT_TRUE(near_ref(y.payload(), ref, testing::tol(c.dt)));
  // For 16-bit types, the naive same-dtype computation (as eager PyTorch: silu rounded, then
  // the product rounded) is never more accurate than the fused one, which rounds once.
  if (c.dt != DType::kBF16 && c.dt != DType::kF16) return;
  Vec silu_r = round_all(silu, c.dt), naive(gv.size());
  for (size_t k = 0; k < gv.size(); ++k) naive[k] = silu_r[k] * uv[k];
  naive = round_all(naive, c.dt);
  EXPECT_LE(max_err(y.payload().to_f64(), ref), max_err(naive, ref));
}

TEST_P(SwigluTest, BackwardMatchesFloat64Reference) {
  const SwiCase c = GetParam();
  Tensor g = randn({c.t, c.i}, c.dt, 3, Device::cpu(), 3.0), u = randn({c.t, c.i}, c.dt, 4);
  Tensor dy = randn({c.t, c.i}, c.dt, 5);
  Guarded dg({c.t, c.i}, c.dt, Device::cpu()), du({c.t, c.i}, c.dt, Device::cpu());
  kernels::swiglu_bwd(dy, g, u, dg.payload(), du.payload());
  EXPECT_TRUE(dg.check());
  EXPECT_TRUE(du.check());
  Vec gv = g.to_f64(), uv = u.to_f64(), d = dy.to_f64(), rg(gv.size()), ru(gv.size());
  for (size_t k = 0; k < gv.size(); ++k) {
    const double s = sig(gv[k]);
    rg[k] = d[k] * uv[k] * s * (1 + gv[k] * (1 - s));
    ru[k] = d[k] * gv[k] * s;
  }
  EXPECT_TRUE(near_ref(dg.payload(), rg, testing::tol(c.dt)));
  EXPECT_TRUE(near_ref(du.payload(), ru, testing::tol(c.dt)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluTest,
                         ::testing::Values(SwiCase{DType::kF32, 1, 1}, SwiCase{DType::kF32, 19, 19},
                                           SwiCase{DType::kF32, 71, 229},
                                           SwiCase{DType::kBF16, 71, 229},
                                           SwiCase{DType::kF16, 19, 33},
                                           SwiCase{DType::kF64, 5, 7}),
                         swi_name);

TEST(Swiglu, GradcheckFloat64) {
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::swiglu(in[0], in[1])};
  };
  EXPECT_TRUE(testing::gradcheck(
      f, {randn({4, 9}, DType::kF64, 6, Device::cpu(), 3.0), randn({4, 9}, DType::kF64, 7)}));
}

TEST(Swiglu, ExtremeGatesStayFinite) {
  Tensor g = kernel_test::make({-1000.0, -90.0, 0.0, 90.0, 1000.0}, {5}, DType::kF32);
  Tensor u = Tensor::full({5}, 2.0, DType::kF32);
  Vec y = kernels::swiglu(g, u).to_f64();
  EXPECT_EQ(y[0], 0.0);
  EXPECT_EQ(y[2], 0.0);
  EXPECT_FLOAT_EQ(y[3], 180.0);
  EXPECT_FLOAT_EQ(y[4], 2000.0);
  Tensor dg = Tensor::empty({5}, DType::kF32), du = Tensor::empty({5}, DType::kF32);
  kernels::swiglu_bwd(Tensor::full({5}, 1.0, DType::kF32), g, u, dg, du);
  for (double v : dg.to_f64()) EXPECT_TRUE(std::isfinite(v));
  EXPECT_FLOAT_EQ(dg.to_f64()[4], 2.0);
}

TEST(Swiglu, OnlyUpNeedsGrad) {
  Tensor g = randn({3, 4}, DType::kF32, 8);
  Tensor u = randn({3, 4}, DType::kF32, 9).set_requires_grad(true);
  Tensor dy = randn({3, 4}, DType::kF32, 10);
  kernels::swiglu(g, u).backward(dy);
  Tensor du = Tensor::empty({3, 4}, DType::kF32);
  kernels::swiglu_bwd(dy, g, u.detach(), Tensor(), du);
  EXPECT_TRUE(testing::all_close(u.grad(), du, 0.0, 0.0));
  EXPECT_FALSE(g.grad().defined());
}

// ---------------------------------------------------------------- geglu (Gemma)

// gelu with torch's tanh approximation, and its derivative, in float64.
double gelu_tanh(double g) {
  const double b = std::sqrt(2.0 / M_PI), k = 0.044715;
  return 0.5 * g * (1 + std::tanh(b * (g + k * g * g * g)));
}
double gelu_tanh_slope(double g) {
  const double b = std::sqrt(2.0 / M_PI), k = 0.044715;
  const double t = std::tanh(b * (g + k * g * g * g));
  return 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * b * (1 + 3 * k * g * g);
}

class GegluTest : public ::testing::TestWithParam<SwiCase> {};

TEST_P(GegluTest, ForwardAndBackwardMatchFloat64Reference) {
  const SwiCase c = GetParam();
  Tensor g = randn({c.t, c.i}, c.dt, 11, Device::cpu(), 3.0), u = randn({c.t, c.i}, c.dt, 12);
  Tensor dy = randn({c.t, c.i}, c.dt, 13);
  Guarded y({c.t, c.i}, c.dt, Device::cpu());
  kernels::geglu_fwd(g, u, y.payload());
  EXPECT_TRUE(y.check());
  Guarded dg({c.t, c.i}, c.dt, Device::cpu()), du({c.t, c.i}, c.dt, Device::cpu());
  kernels::geglu_bwd(dy, g, u, dg.payload(), du.payload());
  EXPECT_TRUE(dg.check());
  EXPECT_TRUE(du.check());
  Vec gv = g.to_f64(), uv = u.to_f64(), d = dy.to_f64(), ref(gv.size()), rg(gv.size()),
      ru(gv.size());
  for (size_t k = 0; k < gv.size(); ++k) {
    ref[k] = gelu_tanh(gv[k]) * uv[k];
    rg[k] = d[k] * uv[k] * gelu_tanh_slope(gv[k]);
    ru[k] = d[k] * gelu_tanh(gv[k]);
  }
  EXPECT_TRUE(near_ref(y.payload(), ref, testing::tol(c.dt)));
  // gelu' sums terms of order one that cancel near g = -3: an absolute floor ten times wider.
  testing::Tol slope_tol = testing::tol(c.dt);
  slope_tol.atol *= 10;
  EXPECT_TRUE(near_ref(dg.payload(), rg, slope_tol));
  EXPECT_TRUE(near_ref(du.payload(), ru, testing::tol(c.dt)));
  // The autograd op gives the raw backward's gradients.
  Tensor ga = g.clone().set_requires_grad(true), ua = u.clone().set_requires_grad(true);
  kernels::geglu(ga, ua).backward(dy);
  EXPECT_TRUE(testing::all_close(ga.grad(), dg.payload(), 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(ua.grad(), du.payload(), 0.0, 0.0));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GegluTest,
                         ::testing::Values(SwiCase{DType::kF32, 1, 1}, SwiCase{DType::kF32, 19, 19},
                                           SwiCase{DType::kF32, 71, 229},
                                           SwiCase{DType::kBF16, 71, 229},
                                           SwiCase{DType::kF16, 19, 33},
                                           SwiCase{DType::kF64, 5, 7}),
                         swi_name);

TEST(Geglu, GradcheckFloat64) {
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::geglu(in[0], in[1])};
  };
  EXPECT_TRUE(testing::gradcheck(
      f, {randn({4, 9}, DType::kF64, 14, Device::cpu(), 3.0), randn({4, 9}, DType::kF64, 15)}));
}

TEST(Geglu, ExtremeGatesStayFinite) {
  Tensor g = kernel_test::make({-1000.0, -9.0, 0.0, 9.0, 1000.0}, {5}, DType::kF32);
  Tensor u = Tensor::full({5}, 2.0, DType::kF32);
  Vec y = kernels::geglu(g, u).to_f64();
  EXPECT_EQ(y[0], 0.0);
  EXPECT_EQ(y[2], 0.0);
  EXPECT_FLOAT_EQ(y[4], 2000.0);
  Tensor dg = Tensor::empty({5}, DType::kF32), du = Tensor::empty({5}, DType::kF32);
  kernels::geglu_bwd(Tensor::full({5}, 1.0, DType::kF32), g, u, dg, du);
  for (double v : dg.to_f64()) EXPECT_TRUE(std::isfinite(v));
  EXPECT_FLOAT_EQ(dg.to_f64()[4], 2.0);
}

}  // namespace
}  // namespace leantune
