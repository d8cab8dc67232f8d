#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/residual.h"

namespace leantune {
namespace {

using kernel_test::near_ref;
using kernel_test::Vec;
using testing::Guarded;
using testing::randn;

struct ResCase {
  DType dt;
  Shape shape;
};

std::string res_name(const ::testing::TestParamInfo<ResCase>& i) {
  std::string s = dtype_name(i.param.dt);
  for (int64_t d : i.param.shape) {
    s += '_';
    s += std::to_string(d);
  }
  return s;
}

class ResidualTest : public ::testing::TestWithParam<ResCase> {};

TEST_P(ResidualTest, ForwardIsTheOnceRoundedSum) {
  const ResCase c = GetParam();
  Tensor a = randn(c.shape, c.dt, 1), b = randn(c.shape, c.dt, 2);
  Guarded y(c.shape, c.dt, Device::cpu());
  kernels::residual_add_fwd(a, b, y.payload());
  EXPECT_TRUE(y.check());
  Vec av = a.to_f64(), bv = b.to_f64(), ref(av.size());
  for (size_t i = 0; i < av.size(); ++i) ref[i] = av[i] + bv[i];
  // The exact sum rounded once to the dtype: bit-exact.
  EXPECT_TRUE(near_ref(y.payload(), kernel_test::round_all(ref, c.dt), 0.0, 0.0));
}

TEST_P(ResidualTest, BackwardPassesTheGradientToBoth) {
  const ResCase c = GetParam();
  Tensor a = randn(c.shape, c.dt, 3).set_requires_grad(true);
  Tensor b = randn(c.shape, c.dt, 4).set_requires_grad(true);
  Tensor dy = randn(c.shape, c.dt, 5);
  kernels::residual_add(a, b).backward(dy);
  EXPECT_TRUE(testing::all_close(a.grad(), dy, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(b.grad(), dy, 0.0, 0.0));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ResidualTest,
    ::testing::Values(ResCase{DType::kF32, {1}}, ResCase{DType::kF32, {19, 19}},
                      ResCase{DType::kF32, {71, 229}}, ResCase{DType::kBF16, {71, 229}},
                      ResCase{DType::kF16, {19, 3, 5}}, ResCase{DType::kF64, {7, 4}}),
    res_name);

TEST(Residual, GradcheckFloat64) {
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::residual_add(in[0], in[1])};
  };
  EXPECT_TRUE(
      testing::gradcheck(f, {randn({4, 6}, DType::kF64, 6), randn({4, 6}, DType::kF64, 7)}));
}

TEST(Residual, OnlyTheInputThatNeedsItGetsAGradient) {
  Tensor a = randn({3, 4}, DType::kF32, 8).set_requires_grad(true);
  Tensor b = randn({3, 4}, DType::kF32, 9);
  kernels::residual_add(a, b).backward(randn({3, 4}, DType::kF32, 10));
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(Residual, NanPropagatesAndStridedInputsWork) {
  Tensor base = randn({4, 10}, DType::kF32, 11);
  Tensor a = base.narrow(1, 2, 5);
  Tensor b = Tensor::full({4, 5}, std::nan(""), DType::kF32);
  Tensor y = kernels::residual_add(a, b);
  for (double v : y.to_f64()) EXPECT_TRUE(std::isnan(v));
  Tensor z = kernels::residual_add(a, a);
  EXPECT_TRUE(testing::all_close(z, ops::scale(a.contiguous(), 2.0), 0.0, 0.0));
}

TEST(Residual, ShapeOrDtypeMismatchIsAnError) {
  EXPECT_THROW(kernels::residual_add(randn({3, 4}, DType::kF32, 1), randn({4, 3}, DType::kF32, 2)),
               Error);
  EXPECT_THROW(kernels::residual_add(randn({3}, DType::kF32, 1), randn({3}, DType::kBF16, 2)),
               Error);
}

}  // namespace
}  // namespace leantune
