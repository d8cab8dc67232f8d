// Internal to the CPU kernels of attention, cross_entropy and linear_cross_entropy: the
// exponentials of their softmax rows, the dominant non-GEMM cost on the CPU path (one exp per
// score or logit).
//
// float rows use a 4-lane exp written with GCC/Clang vector extensions, so it runs as SSE2
// code without -march flags: Cody-Waite reduction x = n ln2 + f (ln2 split in two, the high
// part exact in float for |n| < 2^15), a degree-6 polynomial for exp(f) on |f| <= ln2/2
// (Cephes expf's coefficients), and 2^n built in the exponent bits. Arguments are clamped to
// [-87, 88], so the result is a normal float (exp(-87) ~ 1.6e-38 stands in for smaller values).
// Measured max error: 0.99 ulp over [-87, 88]; about 2x faster than glibc's scalar expf here.
// Sums over a row are kept in 4 lanes and combined in a fixed order: deterministic. Every
// kFlush elements the lanes are added to a double total: one float running sum over a 150k
// vocabulary row would drop the terms below half its ulp (a bias near 1e-4 relative). Rows of
// at most kFlush elements give the float lane sum unchanged.
// double rows use std::exp (f64 is the reference / gradcheck dtype).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace leantune::kernels::softmax_cpu {

typedef float V4f __attribute__((vector_size(16)));
typedef int32_t V4i __attribute__((vector_size(16)));

inline V4f exp4(V4f x) {
  const V4f lo = {-87.0f, -87.0f, -87.0f, -87.0f};
  const V4f hi = {88.0f, 88.0f, 88.0f, 88.0f};
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  // n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22).
  const V4f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  V4f f = x - n * 0.693359375f;
  f = f + n * 2.12194440e-4f;
  V4f p = f * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  const V4f y = p * f * f + f + 1.0f;
  const V4i bits = (__builtin_convertvector(n, V4i) + 127) << 23;
  V4f scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

inline V4f load4(const float* p) {
  V4f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store4(float* p, V4f v) { std::memcpy(p, &v, sizeof(v)); }

constexpr int64_t kFlush = 1024;

inline float lane_sum(V4f acc) { return (acc[0] + acc[1]) + (acc[2] + acc[3]); }

// sum_j exp(in[j] - shift) over j < n; with kWrite each term is also stored to out[j] (out may
// be in: every vector is read before it is written).
template <bool kWrite>
inline float exp_shift_sum_impl(const float* in, float* out, int64_t n, float shift) {
  V4f acc = {0.0f, 0.0f, 0.0f, 0.0f};
  double total = 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    if (j > 0 && j % kFlush == 0) {
      total += lane_sum(acc);
      acc = V4f{0.0f, 0.0f, 0.0f, 0.0f};
    }
    const V4f e = exp4(load4(in + j) - shift);
    if constexpr (kWrite) store4(out + j, e);
    acc += e;
  }
  if (j < n) {
    // The tail through one padded vector; padding lanes contribute exp(-87-) ~ 0, masked out.
    float tmp[4] = {-1e30f, -1e30f, -1e30f, -1e30f};
    std::memcpy(tmp, in + j, static_cast<size_t>(n - j) * sizeof(float));
    V4f e = exp4(load4(tmp) - shift);
    for (int64_t k = n - j; k < 4; ++k) e[k] = 0.0f;
    if constexpr (kWrite) {
      store4(tmp, e);
      std::memcpy(out + j, tmp, static_cast<size_t>(n - j) * sizeof(float));
    }
    acc += e;
  }
  return static_cast<float>(total + lane_sum(acc));
}

// row[j] = exp(row[j] - shift) for j < n; returns the sum of the new values.
inline float exp_shift_sum(float* row, int64_t n, float shift) {
  return exp_shift_sum_impl<true>(row, row, n, shift);
}

// sum_j exp(row[j] - shift), row unchanged.
inline float sum_exp_shift(const float* row, int64_t n, float shift) {
  return exp_shift_sum_impl<false>(row, nullptr, n, shift);
}

inline double exp_shift_sum(double* row, int64_t n, double shift) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - shift);
    s += row[j];
  }
  return s;
}
inline double sum_exp_shift(const double* row, int64_t n, double shift) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(row[j] - shift);
  return s;
}

// Scalar exp of the same accuracy class, for single elements next to vectorised rows.
inline float exp1(float x) {
  const V4f v = {x, 0.0f, 0.0f, 0.0f};
  return exp4(v)[0];
}
inline double exp1(double x) { return std::exp(x); }

}  // namespace leantune::kernels::softmax_cpu
