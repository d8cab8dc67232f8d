// Philox-4x32-10 (Salmon et al., SC'11) and the value transforms built on it. Header-only and
// usable from CUDA device code, so that the host and the device draw bit-identical numbers.
//
// Element i of a draw at generator offset `off` uses the 128-bit block at counter
// (off + i/4) (64 bits), purpose and rank words, and takes word i%4 of the output:
//   uniform:   (w >> 8) * 2^-24                           in [0, 1)
//   normal:    Box-Muller on the word pair (w0,w1) or (w2,w3) of the block; element i%4 takes
//              r*cos, r*sin, r*cos, r*sin. log/sqrt/sincos are evaluated in double with only
//              IEEE add/mul/div/sqrt (no FMA contraction), so host and device agree bit for bit.
//   bernoulli: uniform < p
// A fill (engine/rng.cpp on the host, engine/rng.cu on the device) writes philox_fill_value.
// Host translation units that evaluate these transforms must be compiled with
// -ffp-contract=off (CMake: LT_HOST_RNG_FLAGS): GCC contracts a*b + c into an FMA whenever the
// target has one (-mfma, -march=native, aarch64), whatever -std says, and clang does so within an
// expression by default; the device's __dmul_rn/__dadd_rn never contract.
#pragma once

#include <cstdint>
#include <cstring>

#include "engine/dtype.h"

namespace leantune {

struct PhiloxBlock {
  uint32_t w[4];
};

LT_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

LT_HD PhiloxBlock philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2]) {
  uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
  uint32_t k0 = key_in[0], k1 = key_in[1];
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
    philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n1 = lo1;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    const uint32_t n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// Generator coordinates for one draw.
struct PhiloxParams {
  uint64_t seed;
  uint64_t offset;  // in 128-bit blocks
  uint32_t purpose;
  uint32_t rank;
};

LT_HD PhiloxBlock philox_block(const PhiloxParams& p, uint64_t block) {
  const uint64_t c = p.offset + block;
  const uint32_t ctr[4] = {static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), p.purpose,
                           p.rank};
  const uint32_t key[2] = {static_cast<uint32_t>(p.seed), static_cast<uint32_t>(p.seed >> 32)};
  return philox4x32_10(ctr, key);
}

LT_HD float philox_uniform(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }

#if defined(__CUDA_ARCH__)
#define LT_DMUL(a, b) __dmul_rn(a, b)
#define LT_DADD(a, b) __dadd_rn(a, b)
#define LT_DSUB(a, b) __dsub_rn(a, b)
#define LT_DDIV(a, b) __ddiv_rn(a, b)
#define LT_DSQRT(a) __dsqrt_rn(a)
#else
#define LT_DMUL(a, b) ((a) * (b))
#define LT_DADD(a, b) ((a) + (b))
#define LT_DSUB(a, b) ((a) - (b))
#define LT_DDIV(a, b) ((a) / (b))
#define LT_DSQRT(a) sqrt_host(a)
#endif

#if !defined(__CUDA_ARCH__)
double sqrt_host(double x);  // std::sqrt (IEEE correctly rounded), out of line
#endif

// ln(u) for u in (0, 1]: u = m * 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s),
// s = (m-1)/(m+1), by its odd series; exact bit manipulation for the exponent.
LT_HD double philox_log(double u) {
  uint64_t bits;
  memcpy(&bits, &u, 8);
  int e = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;  // m in [1, 2)
  double m;
  memcpy(&m, &bits, 8);
  if (m > 1.4142135623730951) {
    m = LT_DMUL(m, 0.5);
    e += 1;
  }
  const double s = LT_DDIV(LT_DSUB(m, 1.0), LT_DADD(m, 1.0));
  const double s2 = LT_DMUL(s, s);
  double t = 1.0 / 25.0;
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 23.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 21.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 19.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 17.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 15.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 13.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 11.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 9.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 7.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 5.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0 / 3.0);
  t = LT_DADD(LT_DMUL(t, s2), 1.0);
  const double ln_m = LT_DMUL(LT_DMUL(2.0, s), t);
  return LT_DADD(LT_DMUL(static_cast<double>(e), 0.6931471805599453), ln_m);
}

// sin and cos of 2*pi*v for v in [0, 1): reduce to an eighth of the circle exactly in v, then
// Taylor series on |x| <= pi/4.
LT_HD void philox_sincos2pi(double v, double* s_out, double* c_out) {
  const double q = LT_DMUL(v, 8.0);  // exact
  int oct = static_cast<int>(q);
  if (oct > 7) oct = 7;
  double f = LT_DSUB(q, static_cast<double>(oct));  // [0, 1), exact
  // Angle past the octant's start: x = f * pi/4 in [0, pi/4).
  const double x = LT_DMUL(f, 0.7853981633974483);
  const double x2 = LT_DMUL(x, x);
  double sp = -1.0 / 1307674368000.0;                 // -1/15!
  sp = LT_DADD(LT_DMUL(sp, x2), 1.0 / 6227020800.0);  // 1/13!
  sp = LT_DADD(LT_DMUL(sp, x2), -1.0 / 39916800.0);   // -1/11!
  sp = LT_DADD(LT_DMUL(sp, x2), 1.0 / 362880.0);      // 1/9!
  sp = LT_DADD(LT_DMUL(sp, x2), -1.0 / 5040.0);       // -1/7!
  sp = LT_DADD(LT_DMUL(sp, x2), 1.0 / 120.0);         // 1/5!
  sp = LT_DADD(LT_DMUL(sp, x2), -1.0 / 6.0);          // -1/3!
  sp = LT_DADD(LT_DMUL(sp, x2), 1.0);
  const double sx = LT_DMUL(sp, x);
  double cp = 1.0 / 20922789888000.0;                   // 1/16!
  cp = LT_DADD(LT_DMUL(cp, x2), -1.0 / 87178291200.0);  // -1/14!
  cp = LT_DADD(LT_DMUL(cp, x2), 1.0 / 479001600.0);     // 1/12!
  cp = LT_DADD(LT_DMUL(cp, x2), -1.0 / 3628800.0);      // -1/10!
  cp = LT_DADD(LT_DMUL(cp, x2), 1.0 / 40320.0);         // 1/8!
  cp = LT_DADD(LT_DMUL(cp, x2), -1.0 / 720.0);          // -1/6!
  cp = LT_DADD(LT_DMUL(cp, x2), 1.0 / 24.0);            // 1/4!
  cp = LT_DADD(LT_DMUL(cp, x2), -0.5);
  cp = LT_DADD(LT_DMUL(cp, x2), 1.0);
  const double cx = cp;
  // angle = oct*pi/4 + x; the odd octants' base angles have |sin| = |cos| = 1/sqrt(2).
  const double h = 0.7071067811865476;
  double s, c;
  switch (oct) {
    case 0:
      s = sx;
      c = cx;
      break;
    case 1:
      s = LT_DMUL(h, LT_DADD(cx, sx));
      c = LT_DMUL(h, LT_DSUB(cx, sx));
      break;
    case 2:
      s = cx;
      c = -sx;
      break;
    case 3:
      s = LT_DMUL(h, LT_DSUB(cx, sx));
      c = -LT_DMUL(h, LT_DADD(cx, sx));
      break;
    case 4:
      s = -sx;
      c = -cx;
      break;
    case 5:
      s = -LT_DMUL(h, LT_DADD(cx, sx));
      c = -LT_DMUL(h, LT_DSUB(cx, sx));
      break;
    case 6:
      s = -cx;
      c = sx;
      break;
    default:
      s = -LT_DMUL(h, LT_DSUB(cx, sx));
      c = LT_DMUL(h, LT_DADD(cx, sx));
      break;
  }
  *s_out = s;
  *c_out = c;
}

// Standard normal for element index i within a block's 4 outputs.
LT_HD float philox_normal(const PhiloxBlock& b, int i) {
  const int pair = (i >> 1) << 1;
  const double u1 = LT_DMUL(static_cast<double>(b.w[pair]) + 1.0, 2.3283064365386963e-10);  // (0,1]
  const double u2 = LT_DMUL(static_cast<double>(b.w[pair + 1]), 2.3283064365386963e-10);    // [0,1)
  const double r = LT_DSQRT(LT_DMUL(-2.0, philox_log(u1)));
  double s, c;
  philox_sincos2pi(u2, &s, &c);
  return static_cast<float>(LT_DMUL(r, (i & 1) ? s : c));
}

// Element j of block r of a fill: kind 0 uniform in [a, a + b_minus_a), 1 normal(a, b),
// 2 bernoulli(a) (1 or 0). b_minus_a is formed once by the caller.
LT_HD double philox_fill_value(const PhiloxBlock& r, int j, int kind, double a, double b_minus_a,
                               double b) {
  if (kind == 0) return LT_DADD(a, LT_DMUL(b_minus_a, static_cast<double>(philox_uniform(r.w[j]))));
  if (kind == 1) return LT_DADD(a, LT_DMUL(b, static_cast<double>(philox_normal(r, j))));
  return philox_uniform(r.w[j]) < static_cast<float>(a) ? 1.0 : 0.0;
}

}  // namespace leantune
