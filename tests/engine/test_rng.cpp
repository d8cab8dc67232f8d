#include <gtest/gtest.h>

#include <cmath>

#include "engine/rng.h"
#include "testing/testing.h"

namespace leantune {
namespace {

struct Kat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123's published known-answer vectors for Philox-4x32-10 (tests/kat_vectors).
const Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox, KnownAnswerVectors) {
  for (const Kat& k : kKats) {
    PhiloxBlock b = philox4x32_10(k.ctr, k.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(b.w[i], k.expected[i]) << "word " << i;
  }
}

TEST(Philox, LogAndSincosAgreeWithLibm) {
  for (double u : {1.0, 0.5, 0.999999, 1e-9, 2.3283064365386963e-10, 0.123456789, 0.7071}) {
    EXPECT_NEAR(philox_log(u), std::log(u), 4e-16 * std::max(1.0, std::abs(std::log(u)))) << u;
  }
  for (int i = 0; i < 1000; ++i) {
    const double v = i / 1000.0;
    double s, c;
    philox_sincos2pi(v, &s, &c);
    EXPECT_NEAR(s, std::sin(2 * M_PI * v), 2e-15) << v;
    EXPECT_NEAR(c, std::cos(2 * M_PI * v), 2e-15) << v;
  }
}

TEST(Philox, GeneratorOffsetsAdvanceByBlocks) {
  Generator g(42, RngPurpose::kTest);
  Tensor a = Tensor::empty({10}, DType::kF32);
  uniform_(a, g);
  EXPECT_EQ(g.offset(), 3u);  // ceil(10 / 4)
  // Replaying the offset replays the values.
  Generator h(42, RngPurpose::kTest);
  Tensor b = Tensor::empty({10}, DType::kF32);
  uniform_(b, h);
  EXPECT_EQ(a.to_f32(), b.to_f32());
  // Element i uses word i % 4 of block i / 4.
  PhiloxBlock blk =
      philox_block(PhiloxParams{42, 0, static_cast<uint32_t>(RngPurpose::kTest), 0}, 2);
  EXPECT_EQ(a.to_f32()[9], philox_uniform(blk.w[1]));
}

TEST(Philox, PurposesAndRanksAreIndependentStreams) {
  Tensor a = Tensor::empty({8}, DType::kF32), b = Tensor::empty({8}, DType::kF32),
         c = Tensor::empty({8}, DType::kF32);
  Generator g1(1, RngPurpose::kDropout), g2(1, RngPurpose::kInit), g3(1, RngPurpose::kDropout, 1);
  uniform_(a, g1);
  uniform_(b, g2);
  uniform_(c, g3);
  EXPECT_NE(a.to_f32(), b.to_f32());
  EXPECT_NE(a.to_f32(), c.to_f32());
}

TEST(Philox, DistributionMoments) {
  const int64_t n = 1 << 18;
  Generator g(7, RngPurpose::kTest);
  Tensor u = Tensor::empty({n}, DType::kF64), z = Tensor::empty({n}, DType::kF64),
         m = Tensor::empty({n}, DType::kF64);
  uniform_(u, g, -1.0, 3.0);
  normal_(z, g, 2.0, 0.5);
  bernoulli_(m, g, 0.25);
  auto moments = [](const std::vector<double>& v, double* mean, double* var) {
    double s = 0, s2 = 0;
    for (double x : v) {
      s += x;
      s2 += x * x;
    }
    *mean = s / v.size();
    *var = s2 / v.size() - *mean * *mean;
  };
  double mean, var;
  auto uv = u.to_f64();
  moments(uv, &mean, &var);
  EXPECT_NEAR(mean, 1.0, 0.01);
  EXPECT_NEAR(var, 16.0 / 12.0, 0.01);
  for (double x : uv) ASSERT_TRUE(x >= -1.0 && x < 3.0);
  moments(z.to_f64(), &mean, &var);
  EXPECT_NEAR(mean, 2.0, 0.005);
  EXPECT_NEAR(var, 0.25, 0.005);
  moments(m.to_f64(), &mean, &var);
  EXPECT_NEAR(mean, 0.25, 0.005);
}

class PhiloxCuda : public ::testing::TestWithParam<DType> {};
TEST_P(PhiloxCuda, BitIdenticalToHost) {
  LT_SKIP_WITHOUT_CUDA();
  for (int kind = 0; kind < 3; ++kind) {
    for (int64_t n : {int64_t{1}, int64_t{19}, int64_t{71 * 229}, int64_t{1} << 20}) {
      Tensor h = Tensor::empty({n}, GetParam());
      Tensor d = Tensor::empty({n}, GetParam(), Device::cuda(0));
      Generator gh(99, RngPurpose::kTest), gd(99, RngPurpose::kTest);
      gh.set_offset(12345);
      gd.set_offset(12345);
      if (kind == 0) {
        uniform_(h, gh, -0.5, 2.0);
        uniform_(d, gd, -0.5, 2.0);
      } else if (kind == 1) {
        normal_(h, gh, 0.1, 3.0);
        normal_(d, gd, 0.1, 3.0);
      } else {
        bernoulli_(h, gh, 0.3);
        bernoulli_(d, gd, 0.3);
      }
      EXPECT_EQ(gh.offset(), gd.offset());
      auto hv = h.to_f64(), dv = d.to_f64();
      int64_t diff = 0;
      for (size_t i = 0; i < hv.size(); ++i) diff += hv[i] != dv[i];
      EXPECT_EQ(diff, 0) << "kind " << kind << " n " << n;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Dtypes, PhiloxCuda,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace leantune
