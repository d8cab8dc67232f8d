// GPU tier for linear (kernels/linear.cu, cuBLASLt): forward with and without bias, backward
// (dx, dW, db, each optional), f32 gradients of 16-bit operands, strided inputs and autograd,
// against the CPU path (OpenBLAS) on host copies of the same fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/autograd.h"
#include "kernels/linear.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::all_close;
using testing::Guarded;
using testing::Tol;

const Device kGpu = Device::cuda(0);

// Both sides sum the same rounded inputs in f32 in different orders: absolute error grows with
// the reduction length k for unit-variance data; 16-bit outputs may round one ulp apart.
Tol gpu_tol(DType dt, int64_t k) {
  const double kk = static_cast<double>(std::max<int64_t>(k, 1));
  switch (dt) {
    case DType::kF64:
      return {1e-12 * kk, 1e-10};
    case DType::kF32:
      return {2e-6 * kk, 1e-4};
    case DType::kF16:
      return {2e-3 * std::sqrt(kk), 5e-3};
    default:
      return {1e-2 * std::sqrt(kk), 1e-2};
  }
}

struct Case {
  DType dt;
  int64_t t, in, out;
  bool bias;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  const Case& c = p.param;
  return std::string(dtype_name(c.dt)) + "_T" + std::to_string(c.t) + "_in" + std::to_string(c.in) +
         "_out" + std::to_string(c.out) + (c.bias ? "_bias" : "");
}

class LinearCuda : public ::testing::TestWithParam<Case> {};

TEST_P(LinearCuda, ForwardMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor x = testing::randn({c.t, c.in}, c.dt, 501);
  Tensor w = testing::randn({c.out, c.in}, c.dt, 502, Device::cpu(), 0.5);
  Tensor b = c.bias ? testing::randn({c.out}, c.dt, 503) : Tensor();
  Tensor ref = Tensor::empty({c.t, c.out}, c.dt);
  kernels::linear_fwd(x, w, b, ref);
  Guarded y({c.t, c.out}, c.dt, kGpu);
  kernels::linear_fwd_cuda(x.to(kGpu), w.to(kGpu), c.bias ? b.to(kGpu) : Tensor(), y.payload());
  EXPECT_TRUE(y.check());
  EXPECT_TRUE(all_close(y.payload(), ref, gpu_tol(c.dt, c.in)));
  // A row-strided x (a narrow of a wider buffer) is used in place through its leading dimension.
  Tensor wide = testing::randn({c.t, c.in + 8}, c.dt, 504);
  Tensor ref2 = Tensor::empty({c.t, c.out}, c.dt);
  kernels::linear_fwd(wide.narrow(1, 8, c.in), w, b, ref2);
  Tensor y2 = Tensor::empty({c.t, c.out}, c.dt, kGpu);
  kernels::linear_fwd_cuda(wide.to(kGpu).narrow(1, 8, c.in), w.to(kGpu),
                           c.bias ? b.to(kGpu) : Tensor(), y2);
  EXPECT_TRUE(all_close(y2, ref2, gpu_tol(c.dt, c.in)));
}

TEST_P(LinearCuda, BackwardMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor x = testing::randn({c.t, c.in}, c.dt, 511);
  Tensor w = testing::randn({c.out, c.in}, c.dt, 512, Device::cpu(), 0.5);
  Tensor dy = testing::randn({c.t, c.out}, c.dt, 513);
  Tensor dx_ref = Tensor::empty({c.t, c.in}, c.dt), dw_ref = Tensor::empty({c.out, c.in}, c.dt),
         db_ref = Tensor::empty({c.out}, c.dt);
  kernels::linear_bwd(dy, x, w, dx_ref, dw_ref, db_ref);
  const Tensor xd = x.to(kGpu), wd = w.to(kGpu), gd = dy.to(kGpu);
  Guarded dx({c.t, c.in}, c.dt, kGpu), dw({c.out, c.in}, c.dt, kGpu), db({c.out}, c.dt, kGpu);
  kernels::linear_bwd_cuda(gd, xd, wd, dx.payload(), dw.payload(), db.payload());
  EXPECT_TRUE(dx.check());
  EXPECT_TRUE(dw.check());
  EXPECT_TRUE(db.check());
  EXPECT_TRUE(all_close(dx.payload(), dx_ref, gpu_tol(c.dt, c.out)));
  EXPECT_TRUE(all_close(dw.payload(), dw_ref, gpu_tol(c.dt, c.t)));
  EXPECT_TRUE(all_close(db.payload(), db_ref, gpu_tol(c.dt, c.t)));
  // Frozen W (no dW) and no x gradient; and f32 gradients for 16-bit operands (f64 operands
  // take f64 gradients only: the kernel refuses an f32 dW for them).
  Tensor dx_only = Tensor::empty({c.t, c.in}, c.dt, kGpu);
  kernels::linear_bwd_cuda(gd, Tensor(), wd, dx_only, Tensor(), Tensor());
  EXPECT_TRUE(all_close(dx_only, dx_ref, gpu_tol(c.dt, c.out)));
  if (c.dt == DType::kBF16 || c.dt == DType::kF16) {
    Tensor dw32 = Tensor::empty({c.out, c.in}, DType::kF32, kGpu);
    Tensor db32 = Tensor::empty({c.out}, DType::kF32, kGpu);
    kernels::linear_bwd_cuda(gd, xd, Tensor(), Tensor(), dw32, db32);
    Tensor dw32_ref = Tensor::empty({c.out, c.in}, DType::kF32);
    Tensor db32_ref = Tensor::empty({c.out}, DType::kF32);
    kernels::linear_bwd(dy, x, w, Tensor(), dw32_ref, db32_ref);
    EXPECT_TRUE(all_close(dw32, dw32_ref, gpu_tol(DType::kF32, c.t)));
    EXPECT_TRUE(all_close(db32, db32_ref, gpu_tol(DType::kF32, c.t)));
  } else if (c.dt == DType::kF64) {
    Tensor dw32 = Tensor::empty({c.out, c.in}, DType::kF32, kGpu);
    EXPECT_THROW(kernels::linear_bwd_cuda(gd, xd, Tensor(), Tensor(), dw32, Tensor()), Error);
  }
}

TEST_P(LinearCuda, AutogradOnDeviceMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor x = testing::randn({c.t, c.in}, c.dt, 521);
  Tensor w = testing::randn({c.out, c.in}, c.dt, 522, Device::cpu(), 0.5);
  Tensor b = testing::randn({c.out}, c.dt, 523);
  Tensor dy = testing::randn({c.t, c.out}, c.dt, 524);
  Tensor xh = x.clone().set_requires_grad(true), wh = w.clone().set_requires_grad(true),
         bh = b.clone().set_requires_grad(true);
  Tensor xd = x.to(kGpu).set_requires_grad(true), wd = w.to(kGpu).set_requires_grad(true),
         bd = b.to(kGpu).set_requires_grad(true);
  Tensor yh = kernels::linear(xh, wh, c.bias ? bh : Tensor());
  Tensor yd = kernels::linear(xd, wd, c.bias ? bd : Tensor());
  EXPECT_TRUE(all_close(yd, yh, gpu_tol(c.dt, c.in)));
  yh.backward(dy);
  yd.backward(dy.to(kGpu));
  EXPECT_TRUE(all_close(xd.grad(), xh.grad(), gpu_tol(c.dt, c.out)));
  EXPECT_TRUE(all_close(wd.grad(), wh.grad(), gpu_tol(c.dt, c.t)));
  if (c.bias) {
    EXPECT_TRUE(all_close(bd.grad(), bh.grad(), gpu_tol(c.dt, c.t)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearCuda,
    ::testing::Values(
        Case{DType::kF32, 1, 1, 1, true}, Case{DType::kBF16, 1, 1, 1, false},
        Case{DType::kF32, 19, 19, 19, false}, Case{DType::kBF16, 19, 19, 19, true},
        Case{DType::kF32, 71, 229, 19, true}, Case{DType::kBF16, 71, 229, 19, true},
        Case{DType::kF16, 71, 229, 19, false}, Case{DType::kBF16, 64, 896, 4864, false},
        Case{DType::kBF16, 33, 4864, 896, true}, Case{DType::kF32, 64, 896, 128, true},
        Case{DType::kBF16, 256, 896, 1152, true}, Case{DType::kF64, 19, 71, 23, true}),
    case_name);

}  // namespace
}  // namespace leantune
