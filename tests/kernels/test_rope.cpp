#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "kernel_test_util.h"
#include "kernels/rope.h"

namespace leantune {
namespace {

using kernel_test::make;
using kernel_test::near_ref;
using kernel_test::Vec;
using kernels::RopeConfig;
using testing::Guarded;
using testing::randn;

struct RopeCase {
  DType dt;
  int64_t t, heads, d;
};

std::string rope_name(const ::testing::TestParamInfo<RopeCase>& p) {
  return std::string(dtype_name(p.param.dt)) + "_T" + std::to_string(p.param.t) + "_N" +
         std::to_string(p.param.heads) + "_D" + std::to_string(p.param.d);
}

// Varlen-style positions: restart at 0 every 29 tokens, with a large offset on odd segments.
Tensor positions(int64_t t, DType dt) {
  Vec p(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) p[i] = static_cast<double>((i % 29) + ((i / 29) % 2) * 3000);
  return make(p, {t}, dt);
}

// Float64 rotation; the angle is formed as the contract says (f32 product unless f64).
Vec reference(const Vec& x, const std::vector<int64_t>& pos, const std::vector<double>& inv,
              int64_t t, int64_t heads, int64_t d, bool f32_angle, bool inverse) {
  Vec y(x.size());
  const int64_t half = d / 2;
  for (int64_t tok = 0; tok < t; ++tok)
    for (int64_t i = 0; i < half; ++i) {
      double a = static_cast<double>(pos[tok]) * inv[i];
      if (f32_angle) a = static_cast<float>(a);
      const double c = std::cos(a), s = (inverse ? -1 : 1) * std::sin(a);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t b = (tok * heads + h) * d;
        y[b + i] = x[b + i] * c - x[b + i + half] * s;
        y[b + i + half] = x[b + i + half] * c + x[b + i] * s;
      }
    }
  return y;
}

Tensor table(const RopeConfig& cfg, DType dt) {
  return Tensor::from_doubles(kernels::rope_inv_freq(cfg), {cfg.head_dim / 2},
                              dt == DType::kF64 ? DType::kF64 : DType::kF32);
}

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, ForwardAndInverseMatchFloat64Reference) {
  const RopeCase c = GetParam();
  RopeConfig cfg;
  cfg.head_dim = c.d;
  cfg.theta = 500000.0;
  Tensor x = randn({c.t, c.heads, c.d}, c.dt, 1);
  Tensor pos = positions(c.t, DType::kI64);
  Tensor inv = table(cfg, c.dt);
  Vec xv = x.to_f64();
  for (bool inverse : {false, true}) {
    Guarded y({c.t, c.heads, c.d}, c.dt, Device::cpu());
    kernels::rope_apply(x, pos, inv, inverse, y.payload());
    EXPECT_TRUE(y.check());
    Vec ref = reference(xv, pos.to_i64(), kernels::rope_inv_freq(cfg), c.t, c.heads, c.d,
                        c.dt != DType::kF64, inverse);
    // f32: cos/sin of float32 angles (<= 1 ulp each) and the two-term sum.
    testing::Tol tol = testing::tol(c.dt);
    if (c.dt == DType::kF32) tol = {2e-6, 1e-5};
    EXPECT_TRUE(near_ref(y.payload(), ref, tol)) << "inverse " << inverse;
  }
}

TEST_P(RopeTest, AutogradAppliesTheInverseRotation) {
  const RopeCase c = GetParam();
  RopeConfig cfg;
  cfg.head_dim = c.d;
  Tensor x = randn({c.t, c.heads, c.d}, c.dt, 2).set_requires_grad(true);
  Tensor pos = positions(c.t, DType::kI32);
  Tensor dy = randn({c.t, c.heads, c.d}, c.dt, 3);
  kernels::rope(x, pos, cfg).backward(dy);
  Tensor ref = Tensor::empty(dy.shape(), c.dt);
  kernels::rope_apply(dy, pos, table(cfg, c.dt), true, ref);
  EXPECT_TRUE(testing::all_close(x.grad(), ref, 0.0, 0.0));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeTest,
    ::testing::Values(RopeCase{DType::kF32, 1, 1, 2}, RopeCase{DType::kF32, 19, 3, 64},
                      RopeCase{DType::kF32, 71, 2, 128}, RopeCase{DType::kBF16, 71, 5, 64},
                      RopeCase{DType::kF16, 19, 2, 128}, RopeCase{DType::kF64, 40, 2, 8}),
    rope_name);

TEST(Rope, GradcheckFloat64) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  Tensor pos = positions(6, DType::kI64);
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::rope(in[0], pos, cfg)};
  };
  EXPECT_TRUE(testing::gradcheck(f, {randn({6, 3, 8}, DType::kF64, 4)}));
}

TEST(Rope, InPlaceEqualsOutOfPlace) {
  RopeConfig cfg;
  cfg.head_dim = 16;
  Tensor x = randn({9, 2, 16}, DType::kF32, 5);
  Tensor pos = positions(9, DType::kI64);
  Tensor y = kernels::rope(x, pos, cfg);
  Tensor z = x.clone();
  kernels::rope_apply(z, pos, table(cfg, DType::kF32), false, z);
  EXPECT_TRUE(testing::all_close(z, y, 0.0, 0.0));
}

TEST(Rope, PositionZeroIsTheIdentityAndNormsArePreserved) {
  RopeConfig cfg;
  cfg.head_dim = 64;
  Tensor x = randn({2, 4, 64}, DType::kF64, 6);
  Tensor y = kernels::rope(x, make({0, 1234}, {2}, DType::kI64), cfg);
  EXPECT_TRUE(testing::all_close(y.narrow(0, 0, 1), x.narrow(0, 0, 1), 0.0, 0.0));
  Vec xv = x.to_f64(), yv = y.to_f64();
  for (int h = 0; h < 4; ++h) {
    double nx = 0, ny = 0;
    for (int j = 0; j < 64; ++j) {
      nx += xv[256 + h * 64 + j] * xv[256 + h * 64 + j];
      ny += yv[256 + h * 64 + j] * yv[256 + h * 64 + j];
    }
    EXPECT_NEAR(nx, ny, 1e-10 * nx);
  }
}

// 1 / theta^(2i/D), rounded to float32: within 1 float32 ulp (torch's float32 pow is <= 1 ulp).
TEST(RopeInvFreq, DefaultMatchesTheFloat32Formula) {
  for (int64_t d : {64, 128}) {
    for (double theta : {10000.0, 500000.0, 1000000.0}) {
      RopeConfig cfg;
      cfg.head_dim = d;
      cfg.theta = theta;
      std::vector<double> inv = kernels::rope_inv_freq(cfg);
      ASSERT_EQ(inv.size(), static_cast<size_t>(d / 2));
      EXPECT_EQ(inv[0], 1.0);
      for (int64_t i = 0; i < d / 2; ++i) {
        EXPECT_EQ(inv[i], static_cast<double>(static_cast<float>(inv[i]))) << "not a float32";
        const double e = static_cast<float>(static_cast<float>(2 * i) / static_cast<float>(d));
        const double want = 1.0 / std::pow(theta, e);
        EXPECT_NEAR(inv[i], want, 2.5 * std::ldexp(1.0, -24) * want) << "i " << i;
      }
    }
  }
}

TEST(RopeInvFreq, LinearDividesByTheFactor) {
  RopeConfig cfg;
  cfg.head_dim = 32;
  std::vector<double> base = kernels::rope_inv_freq(cfg);
  cfg.scaling_type = "linear";
  cfg.factor = 4.0;
  std::vector<double> lin = kernels::rope_inv_freq(cfg);
  for (size_t i = 0; i < base.size(); ++i) EXPECT_EQ(lin[i], base[i] / 4.0);
}

// Llama 3.1's published rope_scaling: wavelengths below 8192/4 keep their frequency, above
// 8192/1 are divided by 8, and the band in between interpolates smoothly.
TEST(RopeInvFreq, Llama3BandsFollowTransformers) {
  RopeConfig cfg;
  cfg.head_dim = 128;
  cfg.theta = 500000.0;
  std::vector<double> base = kernels::rope_inv_freq(cfg);
  cfg.scaling_type = "llama3";
  cfg.factor = 8.0;
  cfg.low_freq_factor = 1.0;
  cfg.high_freq_factor = 4.0;
  cfg.original_max_position_embeddings = 8192;
  std::vector<double> l3 = kernels::rope_inv_freq(cfg);
  int high = 0, low = 0, mid = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / base[i];
    if (wavelen < 2048.0) {
      EXPECT_EQ(l3[i], base[i]) << i;
      ++high;
    } else if (wavelen > 8192.0) {
      EXPECT_EQ(l3[i], base[i] / 8.0) << i;
      ++low;
    } else {
      const double s = (8192.0 / wavelen - 1.0) / 3.0;
      const double want = (1 - s) * base[i] / 8.0 + s * base[i];
      EXPECT_NEAR(l3[i], want, 1e-6 * want) << i;
      EXPECT_GT(l3[i], base[i] / 8.0);
      EXPECT_LT(l3[i], base[i]);
      ++mid;
    }
  }
  // wavelen_i = 2pi * 5e5^(i/64): i <= 28 is below 2048, i >= 35 above 8192.
  EXPECT_EQ(high, 29);
  EXPECT_EQ(mid, 6);
  EXPECT_EQ(low, 29);
}

TEST(RopeInvFreq, BadConfigsAreErrors) {
  RopeConfig cfg;
  cfg.head_dim = 7;
  EXPECT_THROW(kernels::rope_inv_freq(cfg), Error);
  cfg.head_dim = 8;
  cfg.scaling_type = "yarn";
  EXPECT_THROW(kernels::rope_inv_freq(cfg), Error);
  EXPECT_THROW(
      kernels::rope(randn({2, 1, 6}, DType::kF32, 1), positions(2, DType::kI64), RopeConfig{}),
      Error);
}

// Partial rotary (Phi-3's partial_rotary_factor) with an attention factor (longrope): the first
// R values of each head rotate with cos and sin scaled by the factor, the rest pass through.
TEST(Rope, PartialRotaryAndAttentionFactorMatchFloat64Reference) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    const int64_t t = 71, heads = 3, d = 16, r = 12;
    RopeConfig cfg;
    cfg.head_dim = d;
    cfg.rotary_dim = r;
    cfg.attention_factor = 1.25;
    const Tensor x = randn({t, heads, d}, dt, 21), pos = positions(t, DType::kI64);
    const Tensor y = kernels::rope(x, pos, cfg);
    const std::vector<double> inv = kernels::rope_inv_freq(cfg);
    ASSERT_EQ(inv.size(), 6u);
    const Vec xv = x.to_f64(), yv = y.to_f64();
    const std::vector<int64_t> p = pos.to_i64();
    double worst = 0;
    for (int64_t tok = 0; tok < t; ++tok)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t b = (tok * heads + h) * d;
        for (int64_t i = 0; i < r / 2; ++i) {
          double a = static_cast<double>(p[tok]) * inv[i];
          if (dt != DType::kF64) a = static_cast<float>(a);
          const double c = 1.25 * std::cos(a), s = 1.25 * std::sin(a);
          worst = std::max(worst, std::abs(yv[b + i] - (xv[b + i] * c - xv[b + i + r / 2] * s)));
          worst = std::max(worst,
                           std::abs(yv[b + i + r / 2] - (xv[b + i + r / 2] * c + xv[b + i] * s)));
        }
        for (int64_t j = r; j < d; ++j) EXPECT_EQ(yv[b + j], xv[b + j]);
      }
    EXPECT_LT(worst, dt == DType::kF64 ? 1e-12 : 2e-5) << dtype_name(dt);
  }
  // The backward is the transpose: the factor times the inverse rotation (float64 gradcheck).
  RopeConfig cfg;
  cfg.head_dim = 8;
  cfg.rotary_dim = 6;
  cfg.attention_factor = 0.8;
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::rope(in[0], positions(5, DType::kI64), cfg)};
  };
  EXPECT_TRUE(testing::gradcheck(f, {randn({5, 2, 8}, DType::kF64, 22)}));
}

// Longrope's tables: 1 / (factor_i * theta^(2i/R)) with the short or the long factors.
TEST(RopeInvFreq, LongropeDividesByTheChosenFactors) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  cfg.theta = 10000.0;
  cfg.scaling_type = "longrope";
  cfg.short_factor = {1.0, 1.5, 2.0, 3.0};
  cfg.long_factor = {2.0, 4.0, 8.0, 16.0};
  cfg.original_max_position_embeddings = 4;
  RopeConfig plain = cfg;
  plain.scaling_type = "";
  const std::vector<double> base = kernels::rope_inv_freq(plain);
  for (bool use_long : {false, true}) {
    cfg.use_long = use_long;
    const std::vector<double> inv = kernels::rope_inv_freq(cfg);
    const std::vector<double>& f = use_long ? cfg.long_factor : cfg.short_factor;
    for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR(inv[i], base[i] / f[i], 1e-7 * base[i]);
  }
  EXPECT_FALSE(cfg.long_for(3));
  EXPECT_TRUE(cfg.long_for(4));
  cfg.long_factor.pop_back();
  cfg.use_long = true;
  EXPECT_THROW(kernels::rope_inv_freq(cfg), Error);
}

}  // namespace
}  // namespace leantune
