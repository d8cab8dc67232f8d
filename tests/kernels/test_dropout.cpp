// dropout (kernels/dropout.h) on the host: the mask is bernoulli_(1 - p) from the same generator
// offset, bit for bit; values are x * (1 / (1 - p)) rounded once; backward regenerates the mask;
// finite differences in f64; strided inputs; p = 0 and p = 1; replay under checkpoint().
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/rng.h"
#include "kernels/dropout.h"
#include "testing/functional.h"
#include "testing/gradcheck.h"
#include "testing/testing.h"

namespace leantune {
namespace {

struct Case {
  DType dt;
  double p;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.dt)) + "_p" +
         std::to_string(static_cast<int>(std::lround(info.param.p * 100)));
}

// The expected output from the bernoulli mask: one product in the accumulation type (f64 for
// f64, else f32), rounded to the dtype.
Tensor expected(const Tensor& x, const Tensor& keep, double p) {
  const std::vector<double> xv = x.to_f64(), kv = keep.to_f64();
  std::vector<double> out(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    if (kv[i] == 0.0) continue;
    out[i] =
        x.dtype() == DType::kF64
            ? xv[i] * (1.0 / (1.0 - p))
            : static_cast<double>(static_cast<float>(xv[i]) * static_cast<float>(1.0 / (1.0 - p)));
  }
  return Tensor::from_doubles(out, x.shape(), x.dtype());
}

class Dropout : public ::testing::TestWithParam<Case> {};

TEST_P(Dropout, MaskIsBernoulliFromTheSameOffset) {
  const auto [dt, p] = GetParam();
  const Shape shape{37, 29};  // numel not a multiple of 4
  Tensor x = testing::randn(shape, dt, 11);
  Generator gen(77, RngPurpose::kDropout);
  gen.set_offset(5);
  Tensor y = kernels::dropout(x, p, gen);
  EXPECT_EQ(gen.offset(), 5u + (37 * 29 + 3) / 4);
  Generator ref(77, RngPurpose::kDropout);
  ref.set_offset(5);
  Tensor keep = Tensor::empty(shape, dt);
  bernoulli_(keep, ref, 1.0 - p);
  EXPECT_EQ(y.to_f64(), expected(x, keep, p).to_f64());
  EXPECT_EQ(y.dtype(), dt);
  EXPECT_EQ(y.shape(), shape);
}

TEST_P(Dropout, KeptFractionIsOneMinusP) {
  const auto [dt, p] = GetParam();
  Tensor x = Tensor::full({200000}, 1.0, dt);
  Generator gen(3, RngPurpose::kDropout);
  const std::vector<double> y = kernels::dropout(x, p, gen).to_f64();
  int64_t kept = 0;
  for (double v : y) kept += v != 0.0;
  EXPECT_NEAR(static_cast<double>(kept) / y.size(), 1.0 - p, 0.005);
}

TEST_P(Dropout, BackwardRegeneratesTheMask) {
  const auto [dt, p] = GetParam();
  const Shape shape{16, 33};
  Tensor x = testing::randn(shape, dt, 21).set_requires_grad(true);
  Tensor g = testing::randn(shape, dt, 22);
  Generator gen(5, RngPurpose::kDropout);
  Tensor y = kernels::dropout(x, p, gen);
  // Draws after the forward must not change the backward mask.
  Tensor other = Tensor::empty({100}, dt);
  uniform_(other, gen);
  y.backward(g);
  Generator ref(5, RngPurpose::kDropout);
  Tensor keep = Tensor::empty(shape, dt);
  bernoulli_(keep, ref, 1.0 - p);
  EXPECT_EQ(x.grad().to_f64(), expected(g, keep, p).to_f64());
}

TEST_P(Dropout, StridedInputUsesLogicalOrder) {
  const auto [dt, p] = GetParam();
  Tensor base = testing::randn({12, 10}, dt, 31);
  Tensor xt = base.transpose(0, 1);  // [10, 12], not contiguous
  Generator g1(9, RngPurpose::kDropout), g2(9, RngPurpose::kDropout);
  EXPECT_EQ(kernels::dropout(xt, p, g1).to_f64(),
            kernels::dropout(xt.contiguous(), p, g2).to_f64());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Dropout,
                         ::testing::Values(Case{DType::kF32, 0.1}, Case{DType::kF32, 0.5},
                                           Case{DType::kBF16, 0.1}, Case{DType::kF16, 0.3},
                                           Case{DType::kF64, 0.25}),
                         case_name);

TEST(DropoutEdges, ZeroProbabilityIsIdentityWithoutDraws) {
  Tensor x = testing::randn({8, 8}, DType::kF32, 1);
  Generator gen(1, RngPurpose::kDropout);
  Tensor y = kernels::dropout(x, 0.0, gen);
  EXPECT_TRUE(y.shares_storage(x));
  EXPECT_EQ(gen.offset(), 0u);
}

TEST(DropoutEdges, ProbabilityOneGivesZeros) {
  Tensor x = testing::randn({5, 7}, DType::kBF16, 2).set_requires_grad(true);
  Generator gen(1, RngPurpose::kDropout);
  Tensor y = kernels::dropout(x, 1.0, gen);
  EXPECT_EQ(ops::max_abs(y), 0.0);
  y.backward(Tensor::full({5, 7}, 1.0, DType::kBF16));
  EXPECT_EQ(ops::max_abs(x.grad()), 0.0);
}

TEST(DropoutEdges, RejectsProbabilityOutsideUnitInterval) {
  Tensor x = Tensor::zeros({4}, DType::kF32);
  Generator gen;
  EXPECT_THROW(kernels::dropout(x, 1.5, gen), Error);
  EXPECT_THROW(kernels::dropout(x, -0.1, gen), Error);
}

TEST(DropoutEdges, EmptyTensor) {
  Tensor x = Tensor::zeros({0, 3}, DType::kF32);
  Generator gen;
  EXPECT_EQ(kernels::dropout(x, 0.5, gen).numel(), 0);
}

TEST(DropoutGradcheck, FiniteDifferencesF64) {
  Generator gen(123, RngPurpose::kDropout);
  testing::GradFn f = [&](const std::vector<Tensor>& in) {
    gen.set_offset(0);  // the same mask on every evaluation
    return std::vector<Tensor>{kernels::dropout(in[0], 0.4, gen)};
  };
  EXPECT_TRUE(testing::gradcheck(f, {testing::randn({6, 9}, DType::kF64, 4)}));
}

// Under checkpoint() the recomputation draws the same masks when the generator is registered,
// so gradients equal those of the plain run.
TEST(DropoutCheckpoint, ReplaysTheSameMasks) {
  static Generator gen(42, RngPurpose::kDropout);
  static GeneratorReplay replay(&gen);
  register_replayable_state(&replay);
  // Two draws: the second mask depends on where the first one left the generator.
  auto body = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{
        fn::add(kernels::dropout(in[0], 0.5, gen), kernels::dropout(in[0], 0.3, gen))};
  };
  Tensor x1 = testing::randn({8, 8}, DType::kF64, 8).set_requires_grad(true);
  Tensor x2 = x1.detach().clone().set_requires_grad(true);
  Tensor g = testing::randn({8, 8}, DType::kF64, 9);

  gen.set_offset(100);
  body({x1})[0].backward(g);
  const uint64_t after_plain = gen.offset();

  gen.set_offset(100);
  checkpoint(body, {x2})[0].backward(g);
  EXPECT_EQ(gen.offset(), after_plain);  // the replay restored the generator afterwards
  EXPECT_EQ(x2.grad().to_f64(), x1.grad().to_f64());
}

}  // namespace
}  // namespace leantune
