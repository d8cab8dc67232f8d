// GPU tier for the fused multi-tensor AdamW (engine/optim.cu): adamw_step_cuda against
// adamw_step_cpu on host copies of the same parameters, states and gradients, over several
// steps: bf16/f16 parameters with f32 masters, f32 parameters in place, gradients of other
// dtypes, per-tensor weight decay, odd and misaligned sizes, more tensors and chunks than one
// launch holds; and the AdamW class on a device. The device math is the host's operation for
// operation (IEEE-rounded, no FMA), so the results are expected to agree to the last bit; the
// tolerances below only allow for a host compiler that contracts to FMA.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "engine/optim.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::all_close;

const Device kGpu = Device::cuda(0);

struct Spec {
  Shape shape;
  DType param;
  DType grad;
  bool master;
  double wd;
  int64_t offset = 0;  // elements of misalignment (a narrow of a larger buffer)
};

// One tensor's state on a device: parameter, master, m, v (the gradient is drawn per step).
AdamWTensor make_state(const Spec& s, Device d, uint64_t seed) {
  const int64_t n = shape_numel(s.shape);
  AdamWTensor t;
  Tensor pbuf = testing::randn({n + s.offset}, s.param, seed, Device::cpu(), 0.5);
  t.param = pbuf.to(d).narrow(0, s.offset, n).view(s.shape);
  if (s.master) {
    t.master = Tensor::empty(s.shape, DType::kF32, d, MemTag::kOptimizer);
    ops::copy(t.master, t.param);
  }
  // Non-zero moments, as after earlier steps (v >= 0).
  t.exp_avg = testing::randn(s.shape, DType::kF32, seed + 1, Device::cpu(), 0.01).to(d);
  t.exp_avg_sq = testing::randu(s.shape, DType::kF32, seed + 2, 0.0, 1e-3, Device::cpu()).to(d);
  t.weight_decay = s.wd;
  return t;
}

::testing::AssertionResult same_state(const AdamWTensor& d, const AdamWTensor& h, DType pdt) {
  const testing::Tol p_tol =
      pdt == DType::kF32 ? testing::Tol{1e-7, 2e-6} : testing::Tol{1e-3, 1e-2};
  for (auto [a, b, tol, what] :
       {std::tuple{d.param, h.param, p_tol, "param"},
        std::tuple{d.exp_avg, h.exp_avg, testing::Tol{1e-9, 2e-6}, "exp_avg"},
        std::tuple{d.exp_avg_sq, h.exp_avg_sq, testing::Tol{1e-12, 2e-6}, "exp_avg_sq"},
        std::tuple{d.master, h.master, testing::Tol{1e-7, 2e-6}, "master"}}) {
    if (!a.defined()) continue;
    ::testing::AssertionResult r = all_close(a, b, tol);
    if (!r) return r << " (" << what << ")";
  }
  return ::testing::AssertionSuccess();
}

void run_and_compare(const std::vector<Spec>& specs, int steps) {
  std::vector<AdamWTensor> dev, hostv;
  for (size_t i = 0; i < specs.size(); ++i) {
    dev.push_back(make_state(specs[i], kGpu, 1000 + 10 * i));
    hostv.push_back(make_state(specs[i], Device::cpu(), 1000 + 10 * i));
  }
  for (int step = 1; step <= steps; ++step) {
    for (size_t i = 0; i < specs.size(); ++i) {
      Tensor g = testing::randn(specs[i].shape, specs[i].grad, 5000 + 100 * step + i);
      hostv[i].grad = g;
      dev[i].grad = g.to(kGpu);
    }
    const AdamWStepArgs args{1e-3 * step, 0.9, 0.95, 1e-8, step, step == 2 ? 0.5 : 1.0};
    adamw_step_cpu(hostv, args);
    adamw_step_cuda(dev, args);
  }
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_TRUE(same_state(dev[i], hostv[i], specs[i].param)) << "tensor " << i;
}

class AdamWCuda : public ::testing::TestWithParam<DType> {};

TEST_P(AdamWCuda, MixedTensorsMatchCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const DType pdt = GetParam();
  const bool master = pdt != DType::kF32;
  std::vector<Spec> specs = {
      {{1}, pdt, DType::kF32, master, 0.1},
      {{19}, pdt, pdt, master, 0.0},
      {{71, 229}, pdt, DType::kF32, master, 0.01},
      {{896}, pdt, DType::kBF16, master, 0.0, 1},  // misaligned: scalar path
      {{4864, 3}, pdt, pdt, master, 0.1, 3},
      {{896, 130}, pdt, DType::kF16, master, 0.05},  // two chunks, a partial last one
      {{65536}, pdt, DType::kF32, master, 0.0},      // exactly one chunk
  };
  run_and_compare(specs, 3);
}

TEST_P(AdamWCuda, ManyTensorsAndChunksSpanSeveralLaunches) {
  LT_SKIP_WITHOUT_CUDA();
  const DType pdt = GetParam();
  std::vector<Spec> specs;
  // 50 tensors (more than one launch's 36 slots) of awkward sizes ...
  for (int i = 0; i < 50; ++i)
    specs.push_back(
        {{37 * i + 1}, pdt, i % 2 ? DType::kF32 : pdt, pdt != DType::kF32, 0.01 * (i % 3)});
  // ... and one tensor of more chunks than one launch's 320 blocks.
  specs.push_back({{330 * 65536 + 5}, pdt, DType::kBF16, pdt != DType::kF32, 0.1});
  run_and_compare(specs, 2);
}

INSTANTIATE_TEST_SUITE_P(Params, AdamWCuda,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class AdamWClassCuda : public ::testing::TestWithParam<DType> {};

TEST_P(AdamWClassCuda, StepOnDeviceMatchesHost) {
  LT_SKIP_WITHOUT_CUDA();
  const DType pdt = GetParam();
  Tensor w0 = testing::randn({71, 229}, pdt, 31), b0 = testing::randn({229}, pdt, 32);
  Tensor wh = w0.clone(), bh = b0.clone();
  Tensor wd = w0.to(kGpu), bd = b0.to(kGpu);
  const AdamWConfig cfg{1e-3, 0.9, 0.999, 1e-8, 0.1};
  AdamW opt_h({{"w", wh, true}, {"b", bh, false}}, cfg);
  AdamW opt_d({{"w", wd, true}, {"b", bd, false}}, cfg);
  for (int step = 1; step <= 3; ++step) {
    Tensor gw = testing::randn({71, 229}, DType::kF32, 40 + step);
    Tensor gb = testing::randn({229}, DType::kF32, 50 + step);
    wh.set_grad(gw);
    bh.set_grad(gb);
    wd.set_grad(gw.to(kGpu));
    bd.set_grad(gb.to(kGpu));
    opt_h.step(1e-3 / step, 0.8);
    opt_d.step(1e-3 / step, 0.8);
  }
  const testing::Tol t = pdt == DType::kF32 ? testing::Tol{1e-7, 2e-6} : testing::Tol{1e-3, 1e-2};
  EXPECT_TRUE(all_close(wd, wh, t));
  EXPECT_TRUE(all_close(bd, bh, t));
  auto sd = opt_d.state_tensors(), sh = opt_h.state_tensors();
  ASSERT_EQ(sd.size(), sh.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_TRUE(sd[i].second.device().is_cuda()) << sd[i].first;
    EXPECT_TRUE(all_close(sd[i].second, sh[i].second, 1e-9, 2e-6)) << sd[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Params, AdamWClassCuda, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace leantune
