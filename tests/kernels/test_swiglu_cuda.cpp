// GPU tier for swiglu (kernels/swiglu.cu): CUDA forward and backward against the CPU path on
// host copies of the same fresh random inputs; guard bands around every output.
#include <gtest/gtest.h>

#include <string>

#include "engine/autograd.h"
#include "kernels/swiglu.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::all_close;
using testing::Guarded;
using testing::Tol;

const Device kGpu = Device::cuda(0);

Tol gpu_tol(DType dt) {
  switch (dt) {
    case DType::kF32:
      return {1e-6, 1e-4};
    case DType::kF16:
      return {1e-3, 5e-3};
    default:
      return {1e-2, 1e-2};
  }
}

struct Case {
  DType dt;
  int64_t t, i;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  return std::string(dtype_name(p.param.dt)) + "_T" + std::to_string(p.param.t) + "_I" +
         std::to_string(p.param.i);
}

class SwigluCuda : public ::testing::TestWithParam<Case> {};

TEST_P(SwigluCuda, ForwardAndBackwardMatchCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  const Shape s{c.t, c.i};
  // Wide gate values reach both branches of the overflow-free sigmoid.
  Tensor g = testing::randn(s, c.dt, 201, Device::cpu(), 6.0);
  Tensor u = testing::randn(s, c.dt, 202);
  Tensor dy = testing::randn(s, c.dt, 203);
  Tensor y_ref = Tensor::empty(s, c.dt), dg_ref = Tensor::empty(s, c.dt),
         du_ref = Tensor::empty(s, c.dt);
  kernels::swiglu_fwd(g, u, y_ref);
  kernels::swiglu_bwd(dy, g, u, dg_ref, du_ref);

  const Tensor gd = g.to(kGpu), ud = u.to(kGpu), dyd = dy.to(kGpu);
  Guarded y(s, c.dt, kGpu), dg(s, c.dt, kGpu), du(s, c.dt, kGpu);
  kernels::swiglu_fwd_cuda(gd, ud, y.payload());
  kernels::swiglu_bwd_cuda(dyd, gd, ud, dg.payload(), du.payload());
  EXPECT_TRUE(y.check());
  EXPECT_TRUE(dg.check());
  EXPECT_TRUE(du.check());
  EXPECT_TRUE(all_close(y.payload(), y_ref, gpu_tol(c.dt)));
  EXPECT_TRUE(all_close(dg.payload(), dg_ref, gpu_tol(c.dt)));
  EXPECT_TRUE(all_close(du.payload(), du_ref, gpu_tol(c.dt)));

  // One gradient at a time; strided inputs (transposed views) are read correctly.
  Tensor du_only = Tensor::empty(s, c.dt, kGpu);
  kernels::swiglu_bwd_cuda(dyd, gd, ud, Tensor(), du_only);
  EXPECT_EQ(du_only.to_f64(), du.payload().to_f64());
  Tensor gt = g.transpose(0, 1).contiguous().to(kGpu).transpose(0, 1);
  Tensor y2 = Tensor::empty(s, c.dt, kGpu);
  kernels::swiglu_fwd_cuda(gt, ud, y2);
  EXPECT_EQ(y2.to_f64(), y.payload().to_f64());
}

TEST_P(SwigluCuda, AutogradOnDeviceMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  const Shape s{c.t, c.i};
  Tensor g = testing::randn(s, c.dt, 211, Device::cpu(), 3.0);
  Tensor u = testing::randn(s, c.dt, 212);
  Tensor dy = testing::randn(s, c.dt, 213);
  Tensor gh = g.clone().set_requires_grad(true), uh = u.clone().set_requires_grad(true);
  Tensor gd = g.to(kGpu).set_requires_grad(true), ud = u.to(kGpu).set_requires_grad(true);
  Tensor yh = kernels::swiglu(gh, uh), yd = kernels::swiglu(gd, ud);
  EXPECT_TRUE(all_close(yd, yh, gpu_tol(c.dt)));
  yh.backward(dy);
  yd.backward(dy.to(kGpu));
  EXPECT_TRUE(all_close(gd.grad(), gh.grad(), gpu_tol(c.dt)));
  EXPECT_TRUE(all_close(ud.grad(), uh.grad(), gpu_tol(c.dt)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluCuda,
                         ::testing::Values(Case{DType::kF32, 1, 1}, Case{DType::kBF16, 1, 1},
                                           Case{DType::kF32, 1, 19}, Case{DType::kBF16, 19, 1},
                                           Case{DType::kF32, 71, 229}, Case{DType::kBF16, 71, 229},
                                           Case{DType::kF16, 71, 229}, Case{DType::kBF16, 7, 4864},
                                           Case{DType::kF32, 7, 4864}, Case{DType::kF64, 19, 71}),
                         case_name);

// Gemma's GeGLU: the CUDA forward and backward against the CPU path, and on-device autograd.
TEST(GegluCuda, ForwardBackwardAndAutogradMatchCpu) {
  LT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    for (auto [t, i] : {std::pair<int64_t, int64_t>{1, 1}, {19, 19}, {71, 229}, {5, 6912}}) {
      Tensor g = testing::randn({t, i}, dt, 301, Device::cpu(), 3.0);
      Tensor u = testing::randn({t, i}, dt, 302), dy = testing::randn({t, i}, dt, 303);
      Tensor y_ref = Tensor::empty({t, i}, dt), dg_ref = Tensor::empty({t, i}, dt),
             du_ref = Tensor::empty({t, i}, dt);
      kernels::geglu_fwd(g, u, y_ref);
      kernels::geglu_bwd(dy, g, u, dg_ref, du_ref);
      const Tensor gd = g.to(kGpu), ud = u.to(kGpu), dyd = dy.to(kGpu);
      Guarded y({t, i}, dt, kGpu), dg({t, i}, dt, kGpu), du({t, i}, dt, kGpu);
      kernels::geglu_fwd_cuda(gd, ud, y.payload());
      kernels::geglu_bwd_cuda(dyd, gd, ud, dg.payload(), du.payload());
      EXPECT_TRUE(y.check() && dg.check() && du.check());
      const testing::Tol tol = dt == DType::kF32   ? testing::Tol{1e-5, 1e-5}
                               : dt == DType::kF64 ? testing::Tol{1e-12, 1e-12}
                                                   : testing::Tol{1e-2, 1.6e-2};
      EXPECT_TRUE(all_close(y.payload(), y_ref, tol)) << dtype_name(dt) << " " << t << "x" << i;
      EXPECT_TRUE(all_close(dg.payload(), dg_ref, tol)) << dtype_name(dt) << " " << t << "x" << i;
      EXPECT_TRUE(all_close(du.payload(), du_ref, tol)) << dtype_name(dt) << " " << t << "x" << i;
      Tensor ga = gd.clone().set_requires_grad(true), ua = ud.clone().set_requires_grad(true);
      kernels::geglu(ga, ua).backward(dyd);
      EXPECT_EQ(ga.grad().to_f64(), dg.payload().to_f64());
      EXPECT_EQ(ua.grad().to_f64(), du.payload().to_f64());
    }
  }
}

}  // namespace
}  // namespace leantune
