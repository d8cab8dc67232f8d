// CPU ops against float64 references where their f32 accuracy matters on real shapes: softmax
// and log-softmax over a vocabulary row (151,936 entries, Qwen2's vocabulary), whose sum runs
// over so many terms that a float running sum would drop the small ones.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/ops.h"
#include "testing/testing.h"

namespace leantune {
namespace {

TEST(Ops, SoftmaxOverAVocabularyRowIsWithinAFewUlpsOfFloat64) {
  const int64_t rows = 2, v = 151936;
  Tensor x = testing::randn({rows, v}, DType::kF32, 51, Device::cpu(), 4.0);
  const std::vector<double> xs = x.to_f64();
  Tensor p = ops::softmax_last(x), lp = ops::log_softmax_last(x);
  const std::vector<double> ps = p.to_f64(), lps = lp.to_f64();
  double worst_p = 0, worst_lp = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, xs[r * v + j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(xs[r * v + j] - m);
    const double lse = m + std::log(s);
    for (int64_t j = 0; j < v; ++j) {
      const double want = std::exp(xs[r * v + j] - lse);
      worst_p = std::max(worst_p, std::abs(ps[r * v + j] - want) / want);
      worst_lp = std::max(worst_lp, std::abs(lps[r * v + j] - (xs[r * v + j] - lse)));
    }
  }
  // x - max rounds in f32 (|x - max| reaches ~35 here, so exp's argument carries up to
  // 35 x 6e-8 absolute): a few 1e-6 relative; a float running sum was off by 2e-4 here.
  EXPECT_LT(worst_p, 5e-6);
  EXPECT_LT(worst_lp, 1e-5);  // |x - lse| up to ~30: a few ulps of that
}

}  // namespace
}  // namespace leantune
