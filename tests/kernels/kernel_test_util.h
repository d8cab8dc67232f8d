// Helpers shared by the CPU kernel tests: host values, rounding through a dtype, comparison
// against float64 references held as plain vectors, and readable parameter names.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/tensor.h"
#include "testing/gradcheck.h"
#include "testing/testing.h"

namespace leantune::kernel_test {

using Vec = std::vector<double>;

inline std::string dt_name(DType dt) { return dtype_name(dt); }

// Tensor from double values, rounded to `dt`.
inline Tensor make(const Vec& v, const Shape& s, DType dt) {
  return Tensor::from_doubles(v, s, dt, Device::cpu(), MemTag::kOther);
}

// The value x takes once stored in dtype dt (bf16/f16/f32 rounding; f64 unchanged).
inline double round_to(double x, DType dt) {
  Tensor t = Tensor::from_doubles({x}, {1}, dt, Device::cpu(), MemTag::kOther);
  return t.to_f64()[0];
}
inline Vec round_all(Vec v, DType dt) {
  Tensor t =
      Tensor::from_doubles(v, {static_cast<int64_t>(v.size())}, dt, Device::cpu(), MemTag::kOther);
  return t.to_f64();
}

// |a - r| <= atol + rtol*|r| elementwise against a double reference; NaN on either side only
// matches NaN, infinities must match exactly.
inline ::testing::AssertionResult near_ref(const Tensor& actual, const Vec& ref, double atol,
                                           double rtol) {
  Vec a = actual.to_f64();
  if (a.size() != ref.size())
    return ::testing::AssertionFailure() << a.size() << " values vs " << ref.size() << " in ref";
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bool ok;
    if (std::isnan(a[i]) || std::isnan(ref[i])) {
      ok = std::isnan(a[i]) && std::isnan(ref[i]);
    } else if (std::isinf(a[i]) || std::isinf(ref[i])) {
      ok = a[i] == ref[i];
    } else {
      const double d = std::abs(a[i] - ref[i]);
      worst = std::max(worst, d);
      ok = d <= atol + rtol * std::abs(ref[i]);
    }
    if (!ok && bad++ == 0) first = static_cast<int64_t>(i);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << a.size() << " differ (atol " << atol << ", rtol " << rtol
         << "); first at " << first << ": " << a[first] << " vs ref " << ref[first]
         << "; max |diff| " << worst;
}
inline ::testing::AssertionResult near_ref(const Tensor& actual, const Vec& ref, testing::Tol t) {
  return near_ref(actual, ref, t.atol, t.rtol);
}

inline double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max |x| over the finite elements (-inf log-sum-exps of rows that see no key aside).
inline double max_abs_finite(const Vec& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

// max |a - r| over the elements; a NaN in either, or infinities that differ, count as infinite
// (equal infinities agree), so a NaN mismatch always fails a bound.
inline double max_err(const Vec& a, const Vec& r) {
  EXPECT_EQ(a.size(), r.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < r.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(r[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(a[i]) || std::isinf(r[i])) {
      if (a[i] != r[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    m = std::max(m, std::abs(a[i] - r[i]));
  }
  return m;
}

// flash-attention's rule: our error against the reference at most twice a naive version's in
// the same dtype, plus a floor of 1e-4 of the reference's magnitude (both exact).
// min_naive: a lower bound on the naive's error used as the yardstick (0: none).
inline ::testing::AssertionResult flash_rule(const char* what, const Vec& ours, const Vec& naive,
                                             const Vec& ref, double min_naive = 0.0) {
  const double e = max_err(ours, ref), en = std::max(max_err(naive, ref), min_naive);
  const double floor = 1e-4 * std::max(max_abs_finite(ref), 1e-3);
  if (e <= 2 * en + floor) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": max error " << e << " > 2 x naive " << en << " + " << floor;
}

// Tolerance for a result of dtype dt whose elements are sums of terms of size `scale`: an
// absolute floor proportional to the magnitude (cancellation makes relative error meaningless
// near zero) plus the dtype's relative tolerance.
inline testing::Tol scaled_tol(DType dt, double scale) {
  testing::Tol t = testing::tol(dt);
  switch (dt) {
    case DType::kF64:
      return {1e-12 * scale + t.atol, t.rtol};
    case DType::kF32:
      return {2e-6 * scale + t.atol, 1e-5};
    case DType::kF16:
      return {2e-3 * scale + t.atol, 2e-3};
    default:
      return {8e-3 * scale + t.atol, t.rtol};
  }
}

}  // namespace leantune::kernel_test
