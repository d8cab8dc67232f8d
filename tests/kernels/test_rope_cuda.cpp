// GPU tier for rope (kernels/rope.cu): the CUDA rotation (forward and inverse) against the CPU
// path on host copies of the same fresh random inputs, with host and device position ids of both
// index types, long-context positions, in-place application and guard bands.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/autograd.h"
#include "kernels/rope.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::all_close;
using testing::Guarded;
using testing::Tol;

const Device kGpu = Device::cuda(0);

// cos/sin agree to a few f32 ulps (sincosf vs the host's libm); one rounding to 16 bits.
Tol gpu_tol(DType dt) {
  switch (dt) {
    case DType::kF32:
      return {2e-6, 1e-4};
    case DType::kF16:
      return {2e-3, 5e-3};
    default:
      return {1e-2, 1e-2};
  }
}

struct Case {
  DType dt;
  int64_t t, heads, d;
  int64_t max_pos;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  const Case& c = p.param;
  return std::string(dtype_name(c.dt)) + "_T" + std::to_string(c.t) + "_N" +
         std::to_string(c.heads) + "_D" + std::to_string(c.d) + "_P" + std::to_string(c.max_pos);
}

// Positions of packed sequences: runs that restart at 0, up to max_pos.
Tensor positions(int64_t t, int64_t max_pos, DType dt) {
  std::vector<int64_t> p(static_cast<size_t>(t));
  int64_t cur = max_pos > 40 ? max_pos - 40 : 0;
  for (int64_t i = 0; i < t; ++i) {
    p[i] = cur;
    cur = (i % 23 == 22) ? 0 : std::min(cur + 1, max_pos);
  }
  Tensor out = Tensor::from_vector(p, {t});
  return dt == DType::kI64 ? out : out.to(dt);
}

class RopeCuda : public ::testing::TestWithParam<Case> {};

TEST_P(RopeCuda, ForwardAndInverseMatchCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  kernels::RopeConfig cfg;
  cfg.head_dim = c.d;
  cfg.theta = 1000000.0;
  const Shape s{c.t, c.heads, c.d};
  const DType table = c.dt == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor inv = Tensor::from_doubles(kernels::rope_inv_freq(cfg), {c.d / 2}, table);
  Tensor x = testing::randn(s, c.dt, 401);
  for (DType pdt : {DType::kI64, DType::kI32}) {
    Tensor pos = positions(c.t, c.max_pos, pdt);
    for (bool inverse : {false, true}) {
      Tensor ref = Tensor::empty(s, c.dt);
      kernels::rope_apply(x, pos, inv, inverse, ref);
      const Tensor xd = x.to(kGpu);
      // Host positions and table, then device ones.
      Guarded y(s, c.dt, kGpu);
      kernels::rope_apply_cuda(xd, pos, inv, inverse, 1.0, y.payload());
      EXPECT_TRUE(y.check());
      EXPECT_TRUE(all_close(y.payload(), ref, gpu_tol(c.dt))) << dtype_name(pdt) << inverse;
      Tensor y2 = Tensor::empty(s, c.dt, kGpu);
      kernels::rope_apply_cuda(xd, pos.to(kGpu), inv.to(kGpu), inverse, 1.0, y2);
      EXPECT_EQ(y2.to_f64(), y.payload().to_f64());
      // In place: y aliases x.
      Tensor xi = xd.clone();
      kernels::rope_apply(xi, pos.to(kGpu), inv.to(kGpu), inverse, xi);
      EXPECT_EQ(xi.to_f64(), y.payload().to_f64());
    }
  }
}

TEST_P(RopeCuda, InverseUndoesForwardAndAutogradMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  kernels::RopeConfig cfg;
  cfg.head_dim = c.d;
  const Shape s{c.t, c.heads, c.d};
  Tensor x = testing::randn(s, c.dt, 411);
  Tensor pos = positions(c.t, c.max_pos, DType::kI64);
  Tensor xd = x.to(kGpu).set_requires_grad(true);
  Tensor xh = x.clone().set_requires_grad(true);
  Tensor yd = kernels::rope(xd, pos.to(kGpu), cfg);
  Tensor yh = kernels::rope(xh, pos, cfg);
  EXPECT_TRUE(all_close(yd, yh, gpu_tol(c.dt)));
  Tensor dy = testing::randn(s, c.dt, 412);
  yd.backward(dy.to(kGpu));
  yh.backward(dy);
  EXPECT_TRUE(all_close(xd.grad(), xh.grad(), gpu_tol(c.dt)));
}

// Phi-3's partial rotary with longrope's attention factor: the rotated part, the pass-through
// part (out of place and in place), forward and backward against the CPU op.
TEST(RopeCudaPartial, PartialRotaryAndFactorMatchCpu) {
  LT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64}) {
    for (auto [d, r] : {std::pair<int64_t, int64_t>{16, 12}, {96, 72}, {128, 64}, {8, 2}}) {
      kernels::RopeConfig cfg;
      cfg.head_dim = d;
      cfg.rotary_dim = r;
      cfg.attention_factor = 1.19;
      const Shape s{71, 3, d};
      Tensor x = testing::randn(s, dt, 421);
      Tensor pos = positions(71, 5000, DType::kI64);
      Tensor xh = x.clone().set_requires_grad(true), xd = x.to(kGpu).set_requires_grad(true);
      Tensor yh = kernels::rope(xh, pos, cfg), yd = kernels::rope(xd, pos.to(kGpu), cfg);
      EXPECT_TRUE(all_close(yd, yh, gpu_tol(dt))) << dtype_name(dt) << " " << d << "/" << r;
      Tensor dy = testing::randn(s, dt, 422);
      yh.backward(dy);
      yd.backward(dy.to(kGpu));
      EXPECT_TRUE(all_close(xd.grad(), xh.grad(), gpu_tol(dt))) << dtype_name(dt);
      const Tensor inv = Tensor::from_doubles(kernels::rope_inv_freq(cfg), {r / 2},
                                              dt == DType::kF64 ? DType::kF64 : DType::kF32);
      Tensor xi = x.to(kGpu);
      kernels::rope_apply(xi, pos.to(kGpu), inv.to(kGpu), false, xi, 1.19);
      EXPECT_EQ(xi.to_f64(), yd.detach().to_f64()) << dtype_name(dt);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeCuda,
    ::testing::Values(Case{DType::kF32, 1, 1, 2, 0}, Case{DType::kBF16, 1, 1, 2, 0},
                      Case{DType::kF32, 19, 3, 6, 100}, Case{DType::kBF16, 19, 3, 6, 100},
                      Case{DType::kF32, 71, 2, 64, 4096}, Case{DType::kBF16, 71, 12, 128, 32768},
                      Case{DType::kF16, 71, 2, 128, 4096}, Case{DType::kF32, 229, 12, 128, 131072},
                      Case{DType::kBF16, 229, 14, 64, 8192}, Case{DType::kF64, 19, 2, 64, 1000}),
    case_name);

}  // namespace
}  // namespace leantune
