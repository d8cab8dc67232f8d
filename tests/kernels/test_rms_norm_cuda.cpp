// GPU tier for rms_norm (kernels/rms_norm.cu): the CUDA forward and backward against the CPU
// path on host copies of the same fresh random inputs; guard bands around every output.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/autograd.h"
#include "kernels/rms_norm.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::all_close;
using testing::Guarded;
using testing::Tol;

const Device kGpu = Device::cuda(0);
constexpr double kEps = 1e-6;

// f32 within 1e-4 relative; 16-bit outputs may land one or two roundings apart (x*rstd is
// rounded before the weight multiply).
Tol gpu_tol(DType dt, double scale) {
  switch (dt) {
    case DType::kF32:
      return {1e-5 * scale, 1e-4};
    case DType::kF16:
      return {2e-3 * scale, 4e-3};
    default:
      return {1.6e-2 * scale, 1.6e-2};
  }
}

DType stat(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

struct Case {
  DType dt;
  int64_t t, h;
  bool offset = false;  // Gemma's (1 + w)
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  return std::string(dtype_name(p.param.dt)) + "_T" + std::to_string(p.param.t) + "_H" +
         std::to_string(p.param.h) + (p.param.offset ? "_unit_offset" : "");
}

class RmsNormCuda : public ::testing::TestWithParam<Case> {};

TEST_P(RmsNormCuda, ForwardMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor x = testing::randn({c.t, c.h}, c.dt, 101, Device::cpu(), 2.0);
  Tensor w = testing::randn({c.h}, c.dt, 102);
  Tensor y_ref = Tensor::empty({c.t, c.h}, c.dt), r_ref = Tensor::empty({c.t}, stat(c.dt));
  kernels::rms_norm_fwd(x, w, kEps, y_ref, r_ref, c.offset);
  Guarded y({c.t, c.h}, c.dt, kGpu), rstd({c.t}, stat(c.dt), kGpu);
  kernels::rms_norm_fwd_cuda(x.to(kGpu), w.to(kGpu), kEps, c.offset, y.payload(), rstd.payload());
  EXPECT_TRUE(y.check());
  EXPECT_TRUE(rstd.check());
  EXPECT_TRUE(all_close(rstd.payload(), r_ref, 0.0, 5e-5));
  EXPECT_TRUE(all_close(y.payload(), y_ref, gpu_tol(c.dt, 2.0)));
}

TEST_P(RmsNormCuda, BackwardMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor x = testing::randn({c.t, c.h}, c.dt, 111, Device::cpu(), 2.0);
  Tensor w = testing::randn({c.h}, c.dt, 112);
  Tensor dy = testing::randn({c.t, c.h}, c.dt, 113);
  Tensor y = Tensor::empty({c.t, c.h}, c.dt), rstd = Tensor::empty({c.t}, stat(c.dt));
  kernels::rms_norm_fwd(x, w, kEps, y, rstd, c.offset);
  Tensor dx_ref = Tensor::empty({c.t, c.h}, c.dt), dw_ref = Tensor::empty({c.h}, c.dt);
  kernels::rms_norm_bwd(dy, x, w, rstd, dx_ref, dw_ref, c.offset);

  const Tensor xd = x.to(kGpu), wd = w.to(kGpu), gd = dy.to(kGpu), rd = rstd.to(kGpu);
  Guarded dx({c.t, c.h}, c.dt, kGpu), dw({c.h}, c.dt, kGpu);
  kernels::rms_norm_bwd_cuda(gd, xd, wd, rd, c.offset, dx.payload(), dw.payload());
  EXPECT_TRUE(dx.check());
  EXPECT_TRUE(dw.check());
  EXPECT_TRUE(all_close(dx.payload(), dx_ref, gpu_tol(c.dt, 4.0)));
  // dw sums t rows: absolute error grows with sqrt(t).
  EXPECT_TRUE(all_close(dw.payload(), dw_ref, gpu_tol(c.dt, 2.0 * std::sqrt(double(c.t)))));

  // Each gradient alone, and bitwise repeatability (no atomics).
  Tensor dx_only = Tensor::empty({c.t, c.h}, c.dt, kGpu);
  kernels::rms_norm_bwd_cuda(gd, xd, wd, rd, c.offset, dx_only, Tensor());
  EXPECT_EQ(dx_only.to_f64(), dx.payload().to_f64());
  Tensor dw_only = Tensor::empty({c.h}, c.dt, kGpu);
  kernels::rms_norm_bwd_cuda(gd, xd, wd, rd, c.offset, Tensor(), dw_only);
  EXPECT_EQ(dw_only.to_f64(), dw.payload().to_f64());
}

TEST_P(RmsNormCuda, AutogradOnDeviceMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor x = testing::randn({c.t, c.h}, c.dt, 121, Device::cpu(), 2.0);
  Tensor w = testing::randn({c.h}, c.dt, 122);
  Tensor dy = testing::randn({c.t, c.h}, c.dt, 123);
  Tensor xh = x.clone().set_requires_grad(true), wh = w.clone().set_requires_grad(true);
  Tensor xd = x.to(kGpu).set_requires_grad(true), wd = w.to(kGpu).set_requires_grad(true);
  Tensor yh = kernels::rms_norm(xh, wh, kEps, c.offset);
  Tensor yd = kernels::rms_norm(xd, wd, kEps, c.offset);
  ASSERT_TRUE(yd.device().is_cuda());
  EXPECT_TRUE(all_close(yd, yh, gpu_tol(c.dt, 2.0)));
  yh.backward(dy);
  yd.backward(dy.to(kGpu));
  EXPECT_TRUE(all_close(xd.grad(), xh.grad(), gpu_tol(c.dt, 4.0)));
  EXPECT_TRUE(all_close(wd.grad(), wh.grad(), gpu_tol(c.dt, 2.0 * std::sqrt(double(c.t)))));
}

// Small, odd and model sizes; 8192 is the widest bf16 row kept in registers, 10000 and 4097 take
// the loop kernels; 4096 rows exercise the persistent backward grid.
INSTANTIATE_TEST_SUITE_P(
    Shapes, RmsNormCuda,
    ::testing::Values(Case{DType::kF32, 1, 1}, Case{DType::kBF16, 1, 1}, Case{DType::kF32, 19, 19},
                      Case{DType::kBF16, 19, 19}, Case{DType::kF32, 71, 229},
                      Case{DType::kBF16, 71, 229}, Case{DType::kF16, 71, 229},
                      Case{DType::kF32, 5, 896}, Case{DType::kBF16, 5, 896},
                      Case{DType::kBF16, 3, 4864}, Case{DType::kF32, 3, 4864},
                      Case{DType::kBF16, 2, 8192}, Case{DType::kBF16, 2, 10000},
                      Case{DType::kF32, 3, 4097}, Case{DType::kBF16, 4096, 896},
                      Case{DType::kF32, 1000, 1536},
                      // Gemma's (1 + w): rows in registers, the loop
                      // kernel, q/k norms over head_dim 256.
                      Case{DType::kF32, 1, 1, true}, Case{DType::kBF16, 71, 229, true},
                      Case{DType::kF32, 71, 256, true}, Case{DType::kBF16, 3, 10000, true},
                      Case{DType::kF16, 19, 1152, true}),
    case_name);

}  // namespace
}  // namespace leantune
