// Shared test helpers: the tolerance table, random inputs, comparisons with NaN handling,
// guard bands, and the devices a test runs on.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ops.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace leantune::testing {

// |a-b| <= atol + rtol*|b|.
struct Tol {
  double atol;
  double rtol;
};
// The tolerance tables, one row per dtype (testing.cpp holds every number).
// tol: an op against a float64 reference on the CPU (TransformerEngine's values).
Tol tol(DType dt);
// The GPU tier: the same op on two backends (CUDA against the CPU), each rounding the same
// inputs through its own order of operations.
//   backend_tol(dt, mag): elementwise, for outputs of magnitude `mag` (scales atol).
//   backend_sum_tol(dt, k, mag): outputs that sum k terms of magnitude `mag`: the absolute part
//     grows as sqrt(k) (the output's magnitude) or, for 32/64-bit outputs, by a per-term
//     accumulation error times k, whichever is larger.
//   backend_norm_tol(dt): normwise relative errors (||a - b|| / ||b||, max|a - b| / max|b|).
//   backend_repeat_tol(dt, mag): both sides do the same operations in the same order (optimizer
//     steps, sums in float64): equal but for FMA contraction by a compiler and one rounding.
Tol backend_tol(DType dt, double mag = 1.0);
Tol backend_sum_tol(DType dt, double k, double mag = 1.0);
double backend_norm_tol(DType dt);
Tol backend_repeat_tol(DType dt, double mag = 1.0);

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
// The bytes of a tensor (a contiguous host copy), for bit-for-bit comparisons.
std::vector<uint8_t> bytes_of(const Tensor& t);

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
