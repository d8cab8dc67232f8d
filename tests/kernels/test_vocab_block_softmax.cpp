// vocab_block_softmax (kernels/vocab_block_softmax.h) on the CPU against a float64 reference:
// the log-sum-exp and target logit merged over vocabulary blocks equal the whole row's, the
// block gradient equals (softmax - onehot) * scale on its columns, ignored rows are untouched
// (lse) or zero (gradient), dz may alias z. Awkward sizes: 1, 19 and 71 rows, vocabularies of
// 1 and 229 columns in blocks of 1, 7 and the whole row; targets at 0, V-1 and inside.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/vocab_block_softmax.h"
#include "testing/testing.h"

namespace leantune {
namespace {

struct Case {
  DType dt;
  int64_t rows, v, block;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  return std::string(dtype_name(p.param.dt)) + "_R" + std::to_string(p.param.rows) + "_V" +
         std::to_string(p.param.v) + "_B" + std::to_string(p.param.block);
}

std::vector<int64_t> targets_for(int64_t rows, int64_t v) {
  std::vector<int64_t> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    y[r] = r % 4 == 3 ? kernels::kIgnoreIndex : r % 4 == 0 ? 0 : r % 4 == 1 ? v - 1 : (r * 37) % v;
  return y;
}

class VocabBlockSoftmax : public ::testing::TestWithParam<Case> {};

TEST_P(VocabBlockSoftmax, BlocksMergeToTheRowAndGradientsMatchFloat64) {
  const Case c = GetParam();
  const testing::Tol tol = testing::tol(c.dt);
  Tensor z = testing::randn({c.rows, c.v}, c.dt, 11, Device::cpu(), 3.0);
  const std::vector<double> zf = z.to_f64();
  const std::vector<int64_t> y = targets_for(c.rows, c.v);
  const Tensor tg = Tensor::from_vector(y, {c.rows});
  // float64 reference per row.
  std::vector<double> ref_lse(c.rows), ref_zy(c.rows);
  for (int64_t r = 0; r < c.rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < c.v; ++j) m = std::max(m, zf[r * c.v + j]);
    for (int64_t j = 0; j < c.v; ++j) s += std::exp(zf[r * c.v + j] - m);
    ref_lse[r] = m + std::log(s);
    ref_zy[r] = y[r] == kernels::kIgnoreIndex ? 0.0 : zf[r * c.v + y[r]];
  }
  Tensor lse = Tensor::full({c.rows}, -INFINITY, c.dt);
  Tensor zy = Tensor::zeros({c.rows}, c.dt);
  const double scale = 0.37;
  for (int64_t v0 = 0; v0 < c.v; v0 += c.block) {
    const int64_t nb = std::min(c.block, c.v - v0);
    Tensor zb = z.narrow(1, v0, nb).contiguous();
    kernels::vocab_block_lse_update(zb, tg, v0, lse, zy);
  }
  const std::vector<double> l = lse.to_f64(), t = zy.to_f64();
  for (int64_t r = 0; r < c.rows; ++r) {
    if (y[r] == kernels::kIgnoreIndex) {
      EXPECT_TRUE(std::isinf(l[r]) && l[r] < 0) << "ignored row " << r << " lse " << l[r];
      EXPECT_EQ(t[r], 0.0) << "ignored row " << r;
      continue;
    }
    EXPECT_NEAR(l[r], ref_lse[r], tol.atol + tol.rtol * std::abs(ref_lse[r])) << "row " << r;
    EXPECT_EQ(t[r], ref_zy[r]) << "row " << r;
  }
  // Gradients per block, in place, against the float64 formula with the reference lse.
  Tensor lse_ref = Tensor::from_doubles(ref_lse, {c.rows}, c.dt);
  for (int64_t v0 = 0; v0 < c.v; v0 += c.block) {
    const int64_t nb = std::min(c.block, c.v - v0);
    Tensor zb = z.narrow(1, v0, nb).contiguous();
    kernels::vocab_block_softmax_grad(zb, tg, v0, lse_ref, scale, zb);
    const std::vector<double> g = zb.to_f64();
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t j = 0; j < nb; ++j) {
        double want = 0;
        if (y[r] != kernels::kIgnoreIndex) {
          const double p = std::exp(zf[r * c.v + v0 + j] - ref_lse[r]);
          want = (v0 + j == y[r] ? p - 1 : p) * scale;
        }
        ASSERT_NEAR(g[r * nb + j], want, tol.atol + tol.rtol * std::abs(want))
            << "row " << r << " column " << v0 + j;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, VocabBlockSoftmax,
    ::testing::Values(Case{DType::kF32, 1, 1, 1}, Case{DType::kF32, 19, 229, 7},
                      Case{DType::kF32, 71, 229, 229}, Case{DType::kF32, 71, 229, 1},
                      Case{DType::kF64, 19, 229, 7}, Case{DType::kF64, 71, 229, 100}),
    case_name);

TEST(VocabBlockSoftmaxChecks, BadShapesAndDtypesAreErrors) {
  Tensor z = Tensor::zeros({3, 4}, DType::kF32);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3});
  Tensor lse = Tensor::zeros({3}, DType::kF32);
  EXPECT_THROW(kernels::vocab_block_lse_update(z, y, 0, Tensor::zeros({2}, DType::kF32),
                                               Tensor::zeros({3}, DType::kF32)),
               Error);
  EXPECT_THROW(kernels::vocab_block_lse_update(Tensor::zeros({3, 4}, DType::kBF16), y, 0, lse,
                                               Tensor::zeros({3}, DType::kBF16)),
               Error);
  EXPECT_THROW(kernels::vocab_block_softmax_grad(
                   z, Tensor::from_vector(std::vector<int32_t>{0, 1, 2}, {3}), 0, lse, 1.0, z),
               Error);
  EXPECT_THROW(kernels::vocab_block_softmax_grad(z, y, -1, lse, 1.0, z), Error);
}

}  // namespace
}  // namespace leantune
