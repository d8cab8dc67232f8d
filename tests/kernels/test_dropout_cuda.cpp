// GPU tier for dropout (kernels/dropout.cu): the CUDA mask and values equal the host's bit for
// bit (the same Philox mapping), forward and backward, and equal bernoulli_ drawn on the device
// from the same offset; strided inputs; no writes outside the output.
#include <gtest/gtest.h>

#include <string>

#include "engine/autograd.h"
#include "engine/rng.h"
#include "kernels/dropout.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::Guarded;

const Device kGpu = Device::cuda(0);

struct Case {
  DType dt;
  double p;
  int64_t n;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.dt)) + "_p" +
         std::to_string(static_cast<int>(info.param.p * 100)) + "_n" + std::to_string(info.param.n);
}

class DropoutCuda : public ::testing::TestWithParam<Case> {};

TEST_P(DropoutCuda, ForwardAndBackwardMatchCpuExactly) {
  LT_SKIP_WITHOUT_CUDA();
  const auto [dt, p, n] = GetParam();
  const Shape shape{n};
  Tensor x = testing::randn(shape, dt, 501);
  const PhiloxParams params{1234, 17, static_cast<uint32_t>(RngPurpose::kDropout), 0};
  Tensor ref = Tensor::empty(shape, dt);
  kernels::dropout_fwd(x, ref, p, params);
  Guarded y(shape, dt, kGpu);
  kernels::dropout_apply_cuda(x.to(kGpu), y.payload(), p, params);
  EXPECT_TRUE(y.check());
  EXPECT_EQ(y.payload().to_f64(), ref.to_f64());

  Tensor dref = Tensor::empty(shape, dt);
  kernels::dropout_bwd(x, dref, p, params);
  Tensor dx = Tensor::empty(shape, dt, kGpu);
  kernels::dropout_bwd(x.to(kGpu), dx, p, params);
  EXPECT_EQ(dx.to_f64(), dref.to_f64());
}

TEST_P(DropoutCuda, MaskEqualsDeviceBernoulli) {
  LT_SKIP_WITHOUT_CUDA();
  const auto [dt, p, n] = GetParam();
  Tensor ones = Tensor::full({n}, 1.0, dt, kGpu);
  Generator g1(8, RngPurpose::kDropout), g2(8, RngPurpose::kDropout);
  const std::vector<double> y = kernels::dropout(ones, p, g1).to_f64();
  Tensor keep = Tensor::empty({n}, dt, kGpu);
  bernoulli_(keep, g2, 1.0 - p);
  const std::vector<double> k = keep.to_f64();
  ASSERT_EQ(y.size(), k.size());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i] != 0.0, k[i] != 0.0) << "element " << i;
  EXPECT_EQ(g1.offset(), g2.offset());
}

TEST_P(DropoutCuda, AutogradAndStridedInput) {
  LT_SKIP_WITHOUT_CUDA();
  const auto [dt, p, n] = GetParam();
  if (n % 8 != 0) GTEST_SKIP() << "2-D view needs n divisible by 8";
  Tensor host = testing::randn({8, n / 8}, dt, 511);
  Tensor xd = host.to(kGpu).transpose(0, 1).set_requires_grad(true);
  Tensor xh = host.transpose(0, 1).set_requires_grad(true);
  Generator gd(3, RngPurpose::kDropout), gh(3, RngPurpose::kDropout);
  Tensor yd = kernels::dropout(xd, p, gd), yh = kernels::dropout(xh, p, gh);
  EXPECT_EQ(yd.to_f64(), yh.to_f64());
  Tensor g = testing::randn(yh.shape(), dt, 512);
  yd.backward(g.to(kGpu));
  yh.backward(g);
  EXPECT_EQ(xd.grad().to_f64(), xh.grad().to_f64());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DropoutCuda,
                         ::testing::Values(Case{DType::kF32, 0.1, 4096},
                                           Case{DType::kF32, 0.5, 1001},
                                           Case{DType::kBF16, 0.1, 65536},
                                           Case{DType::kF16, 0.3, 8}, Case{DType::kF64, 0.25, 777}),
                         case_name);

}  // namespace
}  // namespace leantune
