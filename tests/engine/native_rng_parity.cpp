// Host/device RNG parity on a host CPU with FMA. tests/engine/native_rng.cmake builds this file
// with -march=native plus the flags of the host RNG sources (LT_HOST_RNG_FLAGS, which hold
// -ffp-contract=off): the Philox transforms inlined here must give the bits of strict IEEE double
// arithmetic, which are the device's (__dmul_rn, __dadd_rn, __ddiv_rn, __dsqrt_rn). Without
// -ffp-contract=off GCC fuses a*b + c into FMAs on such a CPU and the hashes below differ.
// The golden hashes were produced by the same code built for baseline x86-64 (no FMA unit, so
// no contraction is possible): FNV-1a over the doubles' bytes.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/philox.h"
#include "engine/rng.h"
#include "testing/testing.h"

namespace leantune {
namespace {

uint64_t fnv1a(uint64_t h, double v) {
  unsigned char b[8];
  std::memcpy(b, &v, 8);
  for (unsigned char c : b) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

constexpr uint64_t kLogSincosGolden = 0x413ccf50ae5ea0abull;
constexpr uint64_t kUniformGolden = 0x7e3596f4702d43bbull;
constexpr uint64_t kNormalGolden = 0xf402951caea481aeull;

const PhiloxParams kParams{20261123, 7, static_cast<uint32_t>(RngPurpose::kTest), 3};
constexpr int64_t kBlocks = 1 << 14;

uint64_t fill_hash(int kind, double a, double b) {
  uint64_t h = kFnvBasis;
  for (int64_t blk = 0; blk < kBlocks; ++blk) {
    const PhiloxBlock r = philox_block(kParams, static_cast<uint64_t>(blk));
    for (int j = 0; j < 4; ++j) h = fnv1a(h, philox_fill_value(r, j, kind, a, b - a, b));
  }
  return h;
}

TEST(PhiloxNative, LogAndSincosGiveStrictIeeeBits) {
  uint64_t h = kFnvBasis;
  for (int64_t i = 0; i < 4 * kBlocks; ++i) {
    const double u = (static_cast<double>(i) + 0.5) / (4 * kBlocks);
    double s, c;
    philox_sincos2pi(u, &s, &c);
    h = fnv1a(fnv1a(fnv1a(h, philox_log(u)), s), c);
  }
  EXPECT_EQ(h, kLogSincosGolden) << std::hex << "0x" << h;
}

TEST(PhiloxNative, FillValuesGiveStrictIeeeBits) {
  const uint64_t hu = fill_hash(0, -0.37, 2.9);
  const uint64_t hn = fill_hash(1, 0.1, 0.02);
  EXPECT_EQ(hu, kUniformGolden) << std::hex << "0x" << hu;
  EXPECT_EQ(hn, kNormalGolden) << std::hex << "0x" << hn;
}

// The library's host fill (engine/rng.cpp, built with the project's flags) writes the same bits.
TEST(PhiloxNative, LibraryFillMatchesTheTransforms) {
  for (int kind : {0, 1}) {
    const double a = kind == 0 ? -0.37 : 0.1, b = kind == 0 ? 2.9 : 0.02;
    Generator g(kParams.seed, RngPurpose::kTest, kParams.rank);
    g.take(4 * kParams.offset);
    Tensor t = Tensor::empty({4 * kBlocks}, DType::kF64);
    if (kind == 0)
      uniform_(t, g, a, b);
    else
      normal_(t, g, a, b);
    uint64_t h = kFnvBasis;
    for (double v : t.to_f64()) h = fnv1a(h, v);
    EXPECT_EQ(h, kind == 0 ? kUniformGolden : kNormalGolden) << "kind " << kind;
  }
}

}  // namespace
}  // namespace leantune
