// GPU tier for residual_add (kernels/residual.cu): CUDA against the CPU path on host copies of
// the same fresh random inputs; guard bands around the output; strided and aliased operands.
#include <gtest/gtest.h>

#include <string>

#include "engine/autograd.h"
#include "kernels/residual.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::Guarded;

const Device kGpu = Device::cuda(0);

struct Case {
  DType dt;
  Shape shape;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  std::string s = dtype_name(p.param.dt);
  for (int64_t d : p.param.shape) s += "_" + std::to_string(d);
  return s;
}

class ResidualCuda : public ::testing::TestWithParam<Case> {};

// One f32 sum rounded once on both sides: the results are identical.
TEST_P(ResidualCuda, ForwardMatchesCpuExactly) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor a = testing::randn(c.shape, c.dt, 301), b = testing::randn(c.shape, c.dt, 302);
  Tensor ref = Tensor::empty(c.shape, c.dt);
  kernels::residual_add_fwd(a, b, ref);
  const Tensor ad = a.to(kGpu), bd = b.to(kGpu);
  Guarded y(c.shape, c.dt, kGpu);
  kernels::residual_add_fwd_cuda(ad, bd, y.payload());
  EXPECT_TRUE(y.check());
  EXPECT_EQ(y.payload().to_f64(), ref.to_f64());
  // In place (y aliases a), and through the dispatching entry point.
  Tensor acc = ad.clone();
  kernels::residual_add_fwd(acc, bd, acc);
  EXPECT_EQ(acc.to_f64(), ref.to_f64());
}

TEST_P(ResidualCuda, StridedInputsAndAutograd) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  if (c.shape.size() != 2) GTEST_SKIP() << "2-D cases only";
  const Shape t{c.shape[1], c.shape[0]};
  Tensor a = testing::randn(t, c.dt, 311), b = testing::randn(c.shape, c.dt, 312);
  Tensor ref = Tensor::empty(c.shape, c.dt);
  kernels::residual_add_fwd(a.transpose(0, 1), b, ref);
  Tensor y = Tensor::empty(c.shape, c.dt, kGpu);
  kernels::residual_add_fwd_cuda(a.to(kGpu).transpose(0, 1), b.to(kGpu), y);
  EXPECT_EQ(y.to_f64(), ref.to_f64());
  Tensor ad = b.to(kGpu).set_requires_grad(true), bd = b.to(kGpu).set_requires_grad(true);
  Tensor out = kernels::residual_add(ad, bd);
  Tensor dy = testing::randn(c.shape, c.dt, 313);
  out.backward(dy.to(kGpu));
  EXPECT_EQ(ad.grad().to_f64(), dy.to_f64());
  EXPECT_EQ(bd.grad().to_f64(), dy.to_f64());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ResidualCuda,
    ::testing::Values(Case{DType::kF32, {1}}, Case{DType::kBF16, {1}}, Case{DType::kF32, {19}},
                      Case{DType::kBF16, {19}}, Case{DType::kF32, {71, 229}},
                      Case{DType::kBF16, {71, 229}}, Case{DType::kF16, {71, 229}},
                      Case{DType::kBF16, {33, 896}}, Case{DType::kF32, {5, 4864}},
                      Case{DType::kF64, {19, 71}}),
    case_name);

}  // namespace
}  // namespace leantune
