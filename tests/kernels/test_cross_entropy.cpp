#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/cross_entropy.h"

namespace leantune {
namespace {

using kernel_test::make;
using kernel_test::near_ref;
using kernel_test::Vec;
using kernels::kIgnoreIndex;
using testing::Guarded;
using testing::randn;

struct CeCase {
  DType dt;
  int64_t t, v;
};

std::string ce_name(const ::testing::TestParamInfo<CeCase>& p) {
  return std::string(dtype_name(p.param.dt)) + "_T" + std::to_string(p.param.t) + "_V" +
         std::to_string(p.param.v);
}

DType stat(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

// Targets covering 0, V-1 and the ignore index, the rest random.
Tensor make_targets(int64_t t, int64_t v, uint64_t seed, DType dt = DType::kI64) {
  Vec y(static_cast<size_t>(t));
  Generator g(seed, RngPurpose::kTest);
  for (int64_t i = 0; i < t; ++i) y[i] = static_cast<double>(g.next_below(v));
  if (t > 0) y[0] = 0;
  if (t > 1) y[t - 1] = static_cast<double>(v - 1);
  for (int64_t i = 2; i < t; i += 5) y[i] = kIgnoreIndex;
  return make(y, {t}, dt);
}

struct CeRef {
  Vec loss, lse, grad;
};

CeRef reference(const Vec& z, const std::vector<int64_t>& y, int64_t t, int64_t v, double scale) {
  CeRef r{Vec(t), Vec(t), Vec(z.size(), 0.0)};
  for (int64_t i = 0; i < t; ++i) {
    double m = -INFINITY;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, z[i * v + j]);
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(z[i * v + j] - m);
    r.lse[i] = m + std::log(s);
    if (y[i] == kIgnoreIndex) continue;
    r.loss[i] = r.lse[i] - z[i * v + y[i]];
    for (int64_t j = 0; j < v; ++j)
      r.grad[i * v + j] = (std::exp(z[i * v + j] - r.lse[i]) - (j == y[i] ? 1.0 : 0.0)) * scale;
  }
  return r;
}

class CrossEntropyTest : public ::testing::TestWithParam<CeCase> {};

TEST_P(CrossEntropyTest, RawForwardAndBackwardMatchFloat64Reference) {
  const CeCase c = GetParam();
  Tensor z = randn({c.t, c.v}, c.dt, 1, Device::cpu(), 3.0);
  Tensor y = make_targets(c.t, c.v, 2, DType::kI32);
  Guarded loss({c.t}, stat(c.dt), Device::cpu()), lse({c.t}, stat(c.dt), Device::cpu());
  kernels::cross_entropy_fwd(z, y, loss.payload(), lse.payload());
  EXPECT_TRUE(loss.check());
  EXPECT_TRUE(lse.check());
  const double scale = 0.37;
  CeRef r = reference(z.to_f64(), y.to_i64(), c.t, c.v, scale);
  // f32 statistics: a few ulps of lse (|lse| ~ 3 * sqrt(2 log V)).
  const testing::Tol st = c.dt == DType::kF64 ? testing::tol(c.dt) : testing::Tol{1e-5, 1e-5};
  EXPECT_TRUE(near_ref(loss.payload(), r.loss, st));
  EXPECT_TRUE(near_ref(lse.payload(), r.lse, st));
  Guarded dz({c.t, c.v}, c.dt, Device::cpu());
  kernels::cross_entropy_bwd(z, y, lse.payload(), scale, dz.payload());
  EXPECT_TRUE(dz.check());
  EXPECT_TRUE(near_ref(dz.payload(), r.grad, kernel_test::scaled_tol(c.dt, scale)));
}

TEST_P(CrossEntropyTest, AutogradLossIsTheNormalisedSum) {
  const CeCase c = GetParam();
  Tensor z = randn({c.t, c.v}, c.dt, 3).set_requires_grad(true);
  Tensor y = make_targets(c.t, c.v, 4);
  const double norm = 7.0;
  Tensor loss = kernels::cross_entropy(z, y, norm);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.dtype(), stat(c.dt));
  CeRef r = reference(z.to_f64(), y.to_i64(), c.t, c.v, 2.0 / norm);
  double want = 0;
  for (double l : r.loss) want += l;
  EXPECT_NEAR(loss.item(), want / norm, c.dt == DType::kF64 ? 1e-12 : 1e-5 * (1 + want / norm));
  loss.backward(Tensor::full({}, 2.0, stat(c.dt)));
  EXPECT_TRUE(near_ref(z.grad(), r.grad, kernel_test::scaled_tol(c.dt, 2.0 / norm)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropyTest,
                         ::testing::Values(CeCase{DType::kF32, 1, 1}, CeCase{DType::kF32, 19, 19},
                                           CeCase{DType::kF32, 71, 229},
                                           CeCase{DType::kBF16, 71, 229},
                                           CeCase{DType::kF16, 19, 50}, CeCase{DType::kF64, 9, 13},
                                           CeCase{DType::kF32, 3, 151936},
                                           CeCase{DType::kBF16, 3, 151936}),
                         ce_name);

TEST(CrossEntropy, GradcheckFloat64) {
  Tensor y = make_targets(6, 5, 5);
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::cross_entropy(in[0], y, 4.0)};
  };
  EXPECT_TRUE(testing::gradcheck(f, {randn({6, 5}, DType::kF64, 6)}));
}

TEST(CrossEntropy, MicroBatchesWithTheGlobalNormalizerSumToTheFullBatchMean) {
  Tensor z = randn({20, 11}, DType::kF32, 7);
  Tensor y = make_targets(20, 11, 8);
  int64_t valid = 0;
  for (int64_t t : y.to_i64()) valid += t != kIgnoreIndex;
  ASSERT_GT(valid, 0);
  ASSERT_LT(valid, 20);
  Tensor full = z.clone().set_requires_grad(true);
  Tensor lf = kernels::cross_entropy(full, y, static_cast<double>(valid));
  lf.backward();
  // Two micro-batches of unequal size and unequal valid counts, same global normalizer.
  Tensor a = z.narrow(0, 0, 7).clone().set_requires_grad(true);
  Tensor b = z.narrow(0, 7, 13).clone().set_requires_grad(true);
  Tensor la = kernels::cross_entropy(a, y.narrow(0, 0, 7).contiguous(), double(valid));
  Tensor lb = kernels::cross_entropy(b, y.narrow(0, 7, 13).contiguous(), double(valid));
  la.backward();
  lb.backward();
  EXPECT_NEAR(la.item() + lb.item(), lf.item(), 1e-6);
  // And the full-batch value is the mean over valid tokens.
  CeRef r = reference(z.to_f64(), y.to_i64(), 20, 11, 1.0);
  double mean = 0;
  for (double l : r.loss) mean += l;
  EXPECT_NEAR(lf.item(), mean / valid, 1e-6);
  EXPECT_TRUE(testing::all_close(a.grad(), full.grad().narrow(0, 0, 7), 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(b.grad(), full.grad().narrow(0, 7, 13), 0.0, 0.0));
}

TEST(CrossEntropy, IgnoredRowsGetZeroLossAndZeroGradient) {
  Tensor z = randn({4, 6}, DType::kF32, 9).set_requires_grad(true);
  Tensor y = make({kIgnoreIndex, 2, kIgnoreIndex, kIgnoreIndex}, {4}, DType::kI64);
  Tensor loss = kernels::cross_entropy(z, y, 1.0);
  CeRef r = reference(z.to_f64(), y.to_i64(), 4, 6, 1.0);
  EXPECT_NEAR(loss.item(), r.loss[1], 1e-6);
  loss.backward();
  Vec g = z.grad().to_f64();
  for (int64_t i : {0, 2, 3})
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(g[i * 6 + j], 0.0);
  EXPECT_LT(g[1 * 6 + 2], 0.0);
}

TEST(CrossEntropy, AllIgnoredGivesZeroAndNoNan) {
  Tensor z = randn({3, 4}, DType::kBF16, 10).set_requires_grad(true);
  Tensor y = make({kIgnoreIndex, kIgnoreIndex, kIgnoreIndex}, {3}, DType::kI32);
  Tensor loss = kernels::cross_entropy(z, y, 1.0);
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  for (double v : z.grad().to_f64()) EXPECT_EQ(v, 0.0);
}

TEST(CrossEntropy, HugeLogitsAreStable) {
  Tensor z = make({1e4, -1e4, 9999.0, 0.0}, {1, 4}, DType::kF32);
  Tensor y = make({2}, {1}, DType::kI64);
  const double want = std::log1p(std::exp(-1.0));  // lse - z_y with z_0 - z_2 = 1
  EXPECT_NEAR(kernels::cross_entropy(z, y, 1.0).item(), 1.0 + want, 1e-3);
}

TEST(CrossEntropy, OutOfRangeTargetIsAnError) {
  Tensor z = randn({3, 5}, DType::kF32, 11);
  for (double bad : {5.0, -1.0, -99.0}) {
    Tensor y = make({1, bad, 0}, {3}, DType::kI64);
    EXPECT_THROW(kernels::cross_entropy(z, y, 1.0), Error) << bad;
    Tensor dz = Tensor::empty({3, 5}, DType::kF32);
    Tensor lse = Tensor::zeros({3}, DType::kF32);
    EXPECT_THROW(kernels::cross_entropy_bwd(z, y, lse, 1.0, dz), Error) << bad;
  }
  EXPECT_THROW(kernels::cross_entropy(z, make({1, 2, 0}, {3}, DType::kI64), 0.0), Error);
}

TEST(ShiftLabels, ShiftsInsideEachSequenceOnly) {
  // Sequences of lengths 4, 1, 0 and 3, then one trailing token outside every sequence.
  Tensor labels = make({10, 11, 12, 13, 20, 30, 31, 32, 99}, {9}, DType::kI64);
  Tensor cu = Tensor::from_vector<int32_t>({0, 4, 5, 5, 8}, {5});
  std::vector<int64_t> got = kernels::shift_labels(labels, cu).to_i64();
  std::vector<int64_t> want = {11, 12, 13,           kIgnoreIndex, kIgnoreIndex,
                               31, 32, kIgnoreIndex, kIgnoreIndex};
  EXPECT_EQ(got, want);
  Tensor l32 = make({1, -100, 3}, {3}, DType::kI32);
  Tensor s32 = kernels::shift_labels(l32, Tensor::from_vector<int32_t>({0, 3}, {2}));
  EXPECT_EQ(s32.dtype(), DType::kI32);
  EXPECT_EQ(s32.to_i64(), (std::vector<int64_t>{-100, 3, -100}));
  EXPECT_THROW(kernels::shift_labels(l32, Tensor::from_vector<int32_t>({0, 4}, {2})), Error);
  EXPECT_THROW(kernels::shift_labels(l32, Tensor::from_vector<int32_t>({0, 2, 1}, {3})), Error);
}

// cross_entropy_row_stats against float64: entropy = lse - sum p z, top-1 hits with ties going to
// the first maximum, ignored rows never a hit; 1, 19 and 71 rows of 229 classes, f32 and f64.
TEST(CrossEntropyRowStats, EntropyAndTopOneMatchFloat64) {
  for (DType dt : {DType::kF32, DType::kF64})
    for (int64_t rows : {1, 19, 71}) {
      const int64_t v = 229;
      Tensor z = testing::randn({rows, v}, dt, 40 + rows, Device::cpu(), 2.0);
      std::vector<double> zf = z.to_f64();
      std::vector<int64_t> y(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        // Every third row's target is its argmax; row 1 gets a tie (the target the later one).
        int64_t arg = 0;
        for (int64_t j = 1; j < v; ++j)
          if (zf[r * v + j] > zf[r * v + arg]) arg = j;
        y[r] = r % 3 == 0 ? arg : r % 3 == 1 ? (arg + 1) % v : kernels::kIgnoreIndex;
        if (r == 1) {  // a tie at columns 0 and 5, the target at 5: the first maximum wins
          zf[r * v + 0] = zf[r * v + 5] = zf[r * v + arg] + 1.0;
          y[r] = 5;
        }
      }
      z = Tensor::from_doubles(zf, {rows, v}, dt);
      zf = z.to_f64();
      const Tensor tg = Tensor::from_vector(y, {rows});
      const DType sd = dt == DType::kF64 ? DType::kF64 : DType::kF32;
      Tensor loss = Tensor::empty({rows}, sd), lse = Tensor::empty({rows}, sd);
      Tensor ent = Tensor::empty({rows}, sd), top = Tensor::empty({rows}, sd);
      kernels::cross_entropy_fwd(z, tg, loss, lse);
      kernels::cross_entropy_row_stats(z, tg, lse, ent, top);
      const std::vector<double> e = ent.to_f64(), t = top.to_f64();
      const testing::Tol tol = testing::tol(dt);
      for (int64_t r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0, pz = 0;
        int64_t arg = 0;
        for (int64_t j = 0; j < v; ++j) {
          m = std::max(m, zf[r * v + j]);
          if (zf[r * v + j] > zf[r * v + arg]) arg = j;
        }
        for (int64_t j = 0; j < v; ++j) s += std::exp(zf[r * v + j] - m);
        const double l = m + std::log(s);
        for (int64_t j = 0; j < v; ++j) pz += std::exp(zf[r * v + j] - l) * zf[r * v + j];
        EXPECT_NEAR(e[r], l - pz, 10 * (tol.atol + tol.rtol * std::abs(l - pz)))
            << dtype_name(dt) << " row " << r;
        const double hit = y[r] != kernels::kIgnoreIndex && arg == y[r] ? 1.0 : 0.0;
        EXPECT_EQ(t[r], hit) << dtype_name(dt) << " row " << r;
      }
      EXPECT_EQ(t[0], 1.0);
      if (rows > 1) {
        EXPECT_EQ(t[1], 0.0) << "a tie goes to the first maximum";
      }
    }
}

}  // namespace
}  // namespace leantune
