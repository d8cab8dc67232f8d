// GPU tier for cross_entropy (kernels/cross_entropy.cu): the one-pass online forward (lse and
// per-row loss) and the one-pass backward against the CPU path on host copies of the same fresh
// random logits; ignored rows, targets 0 and V-1, a Qwen-size vocabulary, large logits, host and
// device targets, in-place gradients, guard bands and autograd.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/autograd.h"
#include "kernels/cross_entropy.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::all_close;
using testing::Guarded;

const Device kGpu = Device::cuda(0);

struct Case {
  DType dt;
  int64_t t, v;
  double std;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  const Case& c = p.param;
  return std::string(dtype_name(c.dt)) + "_T" + std::to_string(c.t) + "_V" + std::to_string(c.v) +
         "_std" + std::to_string(static_cast<int64_t>(c.std));
}

// Every third row ignored; the others cycle through 0, V-1 and pseudo-random targets.
Tensor make_targets(int64_t t, int64_t v, DType dt) {
  std::vector<int64_t> y(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    if (i % 3 == 2)
      y[i] = kernels::kIgnoreIndex;
    else if (i % 5 == 0)
      y[i] = 0;
    else if (i % 5 == 1)
      y[i] = v - 1;
    else
      y[i] = (i * 7919) % v;
  }
  Tensor out = Tensor::from_vector(y, {t});
  return dt == DType::kI64 ? out : out.to(dt);
}

DType stat(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

class CrossEntropyCuda : public ::testing::TestWithParam<Case> {};

TEST_P(CrossEntropyCuda, ForwardAndBackwardMatchCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor z = testing::randn({c.t, c.v}, c.dt, 701, Device::cpu(), c.std);
  const Tensor zd = z.to(kGpu);
  const double scale = 0.37;
  for (DType tdt : {DType::kI64, DType::kI32}) {
    Tensor y = make_targets(c.t, c.v, tdt);
    Tensor loss_ref = Tensor::empty({c.t}, stat(c.dt)), lse_ref = Tensor::empty({c.t}, stat(c.dt));
    kernels::cross_entropy_fwd(z, y, loss_ref, lse_ref);
    Guarded loss({c.t}, stat(c.dt), kGpu), lse({c.t}, stat(c.dt), kGpu);
    kernels::cross_entropy_fwd_cuda(zd, y.to(kGpu), loss.payload(), lse.payload());
    EXPECT_TRUE(loss.check());
    EXPECT_TRUE(lse.check());
    // lse ~ log V + max: f32 agrees to ~1e-6 relative; the loss is a difference of two such
    // numbers, so its absolute error follows lse's magnitude.
    const double mag = c.std + 12.0;
    EXPECT_TRUE(all_close(lse.payload(), lse_ref, 2e-6 * mag, 1e-5));
    EXPECT_TRUE(all_close(loss.payload(), loss_ref, 4e-6 * mag, 1e-5));

    Tensor d_ref = Tensor::empty({c.t, c.v}, c.dt);
    kernels::cross_entropy_bwd(z, y, lse_ref, scale, d_ref);
    Guarded d({c.t, c.v}, c.dt, kGpu);
    kernels::cross_entropy_bwd_cuda(zd, y, lse.payload(), scale, d.payload());
    EXPECT_TRUE(d.check());
    // Probabilities scaled by 0.37: tiny absolute values; p_y - 1 near -0.37.
    const testing::Tol t = c.dt == DType::kF32   ? testing::Tol{1e-7, 1e-4}
                           : c.dt == DType::kF64 ? testing::Tol{1e-14, 1e-10}
                                                 : testing::Tol{1e-4, 1e-2};
    EXPECT_TRUE(all_close(d.payload(), d_ref, t));
    // In place: dlogits overwrite the logits.
    Tensor zi = zd.clone();
    kernels::cross_entropy_bwd_cuda(zi, y.to(kGpu), lse.payload(), scale, zi);
    EXPECT_EQ(zi.to_f64(), d.payload().to_f64());
  }
}

TEST_P(CrossEntropyCuda, AutogradOnDeviceMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor z = testing::randn({c.t, c.v}, c.dt, 711, Device::cpu(), c.std);
  Tensor y = make_targets(c.t, c.v, DType::kI64);
  const double norm = 40.0;
  Tensor zh = z.clone().set_requires_grad(true), zd = z.to(kGpu).set_requires_grad(true);
  Tensor lh = kernels::cross_entropy(zh, y, norm);
  Tensor ld = kernels::cross_entropy(zd, y.to(kGpu), norm);
  EXPECT_NEAR(ld.item(), lh.item(), 1e-5 * (std::abs(lh.item()) + 1.0));
  lh.backward();
  ld.backward();
  const testing::Tol t = c.dt == DType::kF32   ? testing::Tol{1e-8, 1e-4}
                         : c.dt == DType::kF64 ? testing::Tol{1e-15, 1e-10}
                                               : testing::Tol{1e-5, 1e-2};
  EXPECT_TRUE(all_close(zd.grad(), zh.grad(), t));
}

TEST_P(CrossEntropyCuda, BadTargetIsAnErrorAndLeavesOutputsUntouched) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor zd = testing::randn({c.t, c.v}, c.dt, 721).to(kGpu);
  std::vector<int64_t> y(static_cast<size_t>(c.t), 0);
  y.back() = c.v;
  Tensor yt = Tensor::from_vector(y, {c.t});
  Tensor loss = Tensor::full({c.t}, 5.0, stat(c.dt), kGpu),
         lse = Tensor::full({c.t}, 5.0, stat(c.dt), kGpu);
  EXPECT_THROW(kernels::cross_entropy_fwd_cuda(zd, yt, loss, lse), Error);
  EXPECT_THROW(kernels::cross_entropy_fwd_cuda(zd, yt.to(kGpu), loss, lse), Error);
  for (double v : loss.to_f64()) EXPECT_EQ(v, 5.0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CrossEntropyCuda,
    ::testing::Values(Case{DType::kF32, 1, 1, 1.0}, Case{DType::kBF16, 1, 1, 1.0},
                      Case{DType::kF32, 19, 19, 1.0}, Case{DType::kBF16, 19, 19, 3.0},
                      Case{DType::kF32, 71, 229, 3.0}, Case{DType::kBF16, 71, 229, 3.0},
                      Case{DType::kF16, 71, 229, 2.0}, Case{DType::kBF16, 33, 4864, 3.0},
                      Case{DType::kF32, 9, 151936, 3.0}, Case{DType::kBF16, 9, 151936, 3.0},
                      Case{DType::kF32, 19, 1001, 1000.0}, Case{DType::kF64, 19, 229, 3.0}),
    case_name);

TEST(CrossEntropyRowStatsCuda, MatchesTheCpuOnFreshInputs) {
  LT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64})
    for (auto [rows, v] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {19, 229}, {71, 4099}}) {
      const Tensor z = testing::randn({rows, v}, dt, 7 + rows, Device::cpu(), 2.0);
      std::vector<int64_t> y(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) y[r] = r % 4 == 3 ? kernels::kIgnoreIndex : (r * 31) % v;
      const Tensor tg = Tensor::from_vector(y, {rows});
      const DType sd = dt == DType::kF64 ? DType::kF64 : DType::kF32;
      Tensor loss = Tensor::empty({rows}, sd), lse = Tensor::empty({rows}, sd);
      Tensor ent = Tensor::empty({rows}, sd), top = Tensor::empty({rows}, sd);
      kernels::cross_entropy_fwd(z, tg, loss, lse);
      kernels::cross_entropy_row_stats(z, tg, lse, ent, top);
      Tensor entd = Tensor::empty({rows}, sd, kGpu), topd = Tensor::empty({rows}, sd, kGpu);
      kernels::cross_entropy_row_stats(z.to(kGpu), tg.to(kGpu), lse.to(kGpu), entd, topd);
      EXPECT_TRUE(all_close(entd.to(Device::cpu()), ent, testing::tol(sd)));
      EXPECT_TRUE(all_close(topd.to(Device::cpu()), top, 0.0, 0.0));
    }
}

}  // namespace
}  // namespace leantune
