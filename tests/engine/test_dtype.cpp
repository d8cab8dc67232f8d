#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/dtype.h"
#include "engine/tensor.h"

namespace leantune {
namespace {

uint16_t bf(uint32_t bits) { return bf16_from_bits32(bits); }

TEST(BF16, RoundsToNearestEven) {
  // 1.0 = 0x3f800000. The bf16 ulp at 1.0 is 2^-7 (bit 16 of the f32 pattern).
  EXPECT_EQ(bf(0x3f800000), 0x3f80);
  EXPECT_EQ(bf(0x3f807fff), 0x3f80);  // below half: down
  EXPECT_EQ(bf(0x3f808000), 0x3f80);  // exactly half, even below: stays
  EXPECT_EQ(bf(0x3f818000), 0x3f82);  // exactly half, odd below: up to even
  EXPECT_EQ(bf(0x3f808001), 0x3f81);  // above half: up
  EXPECT_EQ(bf(0xbf818000), 0xbf82);  // negative ties alike
}

TEST(BF16, SpecialValues) {
  EXPECT_EQ(bf(0x7f800000), 0x7f80);  // +inf
  EXPECT_EQ(bf(0xff800000), 0xff80);  // -inf
  EXPECT_EQ(bf(0x7f7fffff), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(bf(0x7f7f7fff), 0x7f7f);  // largest bf16 below max stays finite
  EXPECT_EQ(bf(0x80000000), 0x8000);  // -0
  // NaN stays NaN (quiet), including payloads that would round into the exponent.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fffffffu}) {
    const uint16_t b = bf(nan);
    EXPECT_EQ(b & 0x7f80, 0x7f80);
    EXPECT_NE(b & 0x007f, 0);
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000);
    EXPECT_TRUE(std::isnan(bf16_to_f32(b)));
  }
}

TEST(BF16, Subnormals) {
  EXPECT_EQ(bf(0x00000001), 0x0000);  // tiniest subnormal: to zero
  EXPECT_EQ(bf(0x00010000), 0x0001);  // smallest bf16 subnormal exactly
  EXPECT_EQ(bf(0x00018000), 0x0002);  // tie, odd: up
  EXPECT_EQ(bf(0x00008000), 0x0000);  // tie, even (zero): down
  EXPECT_EQ(bf(0x007fffff), 0x0080);  // largest subnormal rounds up to the smallest normal
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));
}

TEST(F16, RoundsToNearestEvenAndEdges) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);                          // below the midpoint to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                          // tie rounds to even = inf
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even: down
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd: up
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);             // half of it: even 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -24)), 0x0002);             // 1.5 ulp: tie up
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // to normal
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite half round-trips
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h | 0x8000))), h | 0x8000) << h;
  }
}

TEST(DType, NamesAndSizes) {
  DType t;
  ASSERT_TRUE(dtype_from_safetensors_name("BF16", &t));
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_EQ(dtype_size(t), 2u);
  EXPECT_STREQ(dtype_safetensors_name(DType::kF8E4M3), "F8_E4M3");
  EXPECT_FALSE(dtype_from_safetensors_name("F4", &t));
  ASSERT_TRUE(dtype_from_string("bfloat16", &t));
  EXPECT_EQ(t, DType::kBF16);
  ASSERT_TRUE(dtype_from_string("float32", &t));
  EXPECT_EQ(t, DType::kF32);
}

TEST(Tensor, ConversionsThroughCopy) {
  Tensor f = Tensor::from_vector<float>({1.0f, 1.00390625f, -2.5f, 65520.0f}, {4});
  Tensor b = f.to(DType::kBF16);
  Tensor h = f.to(DType::kF16);
  EXPECT_EQ(b.to_f32(), (std::vector<float>{1.0f, 1.0f, -2.5f, 65536.0f}));
  EXPECT_EQ(h.to_f32()[3], std::numeric_limits<float>::infinity());
  Tensor i = Tensor::from_vector<int32_t>({3, -4}, {2}).to(DType::kF32);
  EXPECT_EQ(i.to_f32(), (std::vector<float>{3.0f, -4.0f}));
}

TEST(Tensor, ViewsShareStorageAndCheckShapes) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor r = t.reshape({3, 2});
  EXPECT_TRUE(r.shares_storage(t));
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_FALSE(n.is_contiguous());
  EXPECT_EQ(n.contiguous().to_f32(), (std::vector<float>{1, 2, 4, 5}));
  Tensor tr = t.transpose(0, 1);
  EXPECT_EQ(tr.contiguous().to_f32(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  n.fill_(9);
  EXPECT_EQ(t.to_f32(), (std::vector<float>{0, 9, 9, 3, 9, 9}));
  EXPECT_THROW(t.view({4, 2}), Error);
  EXPECT_THROW(t.narrow(1, 2, 2), Error);
  EXPECT_THROW(n.view({4}), Error);
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{6}));
}

}  // namespace
}  // namespace leantune
