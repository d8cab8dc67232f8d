// Shared test helpers: the tolerance table, random inputs, comparisons with NaN handling,
// guard bands, and the devices a test runs on.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/ops.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace leantune::testing {

// One tolerance table per dtype (TransformerEngine's values): |a-b| <= atol + rtol*|b|.
struct Tol {
  double atol;
  double rtol;
};
Tol tol(DType dt);

// Random normal tensor (deterministic per seed).
Tensor randn(const Shape& shape, DType dt, uint64_t seed, Device dev = Device::cpu(),
             double std = 1.0);
Tensor randu(const Shape& shape, DType dt, uint64_t seed, double lo, double hi,
             Device dev = Device::cpu());

// Compares elementwise; a NaN in one and not the other fails, as do mismatched infinities.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, Tol t);
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol,
                                     double rtol);
// max |a - b|
double max_abs_diff(const Tensor& a, const Tensor& b);

// A buffer with `guard` sentinel elements before and after a [numel] payload; check() verifies
// the sentinels are untouched after a kernel wrote the payload.
class Guarded {
 public:
  Guarded(const Shape& shape, DType dt, Device dev, int64_t guard = 64);
  Tensor payload() const { return payload_; }
  ::testing::AssertionResult check() const;

 private:
  Tensor whole_;
  Tensor payload_;
  int64_t guard_;
};

// Path of a file under tests/fixtures (committed fixtures).
std::string fixture_path(const std::string& rel);
// A fresh temporary directory for one test.
std::string temp_dir(const std::string& name);

bool have_cuda();
#define LT_SKIP_WITHOUT_CUDA() \
  if (!::leantune::testing::have_cuda()) GTEST_SKIP() << "no CUDA device"

}  // namespace leantune::testing
