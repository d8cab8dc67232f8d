// GPU tier for 8-bit AdamW (kernels/optim_8bit.cu): adamw8bit_step_cuda against the CPU step on
// copies of the same parameters, gradients and states over three steps: 8-bit parameters (full
// and short last blocks, f32 and bf16, gradients of another dtype) and 32-bit ones below the
// size threshold, with and without weight decay. The device does the host's operations with
// the same rounding, so parameters, codes and absmax must agree to the last bit.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/optim_8bit.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using kernels::Adam8Tensor;

struct Case {
  std::string name;
  int64_t n;
  DType param;
  DType grad;
  double wd;
  bool sr = false;  // stochastic rounding of a bf16 param
};

Adam8Tensor make(const Case& c, Device d) {
  Adam8Tensor t;
  t.param = testing::randn({c.n}, c.param, 11, Device::cpu(), 0.1).to(d);
  const bool q = c.n >= kernels::kOptim8bitMinSize;
  const DType sdt = q ? DType::kU8 : DType::kF32;
  t.state1 = Tensor::zeros({c.n}, sdt, d, MemTag::kOptimizer);
  t.state2 = Tensor::zeros({c.n}, sdt, d, MemTag::kOptimizer);
  if (q) {
    const int64_t blocks = (c.n + 255) / 256;
    t.absmax1 = Tensor::zeros({blocks}, DType::kF32, d, MemTag::kOptimizer);
    t.absmax2 = Tensor::zeros({blocks}, DType::kF32, d, MemTag::kOptimizer);
  }
  t.weight_decay = c.wd;
  t.stochastic_round = c.sr;
  t.seed = 0x5eed;
  return t;
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<uint8_t> v(h.nbytes());
  std::memcpy(v.data(), h.data_ptr(), v.size());
  return v;
}

class Optim8bitCuda : public ::testing::TestWithParam<Case> {};

TEST_P(Optim8bitCuda, MatchesTheCpuStepBitForBit) {
  LT_SKIP_WITHOUT_CUDA();
  const Case& c = GetParam();
  const Device gpu = Device::cuda(0);
  Adam8Tensor h = make(c, Device::cpu()), g = make(c, gpu);
  for (int s = 1; s <= 3; ++s) {
    const Tensor grad = testing::randn({c.n}, c.grad, 100 + s, Device::cpu(), 0.01);
    h.grad = grad;
    g.grad = grad.to(gpu);
    const AdamWStepArgs args{1e-3 * s, 0.9, 0.999, 1e-8, s, 0.75};
    kernels::adamw8bit_step_cpu({h}, args);
    kernels::adamw8bit_step_cuda({g}, args);
    EXPECT_EQ(bytes(h.param), bytes(g.param)) << "param, step " << s;
    EXPECT_EQ(bytes(h.state1), bytes(g.state1)) << "state1, step " << s;
    EXPECT_EQ(bytes(h.state2), bytes(g.state2)) << "state2, step " << s;
    if (h.absmax1.defined()) {
      EXPECT_EQ(bytes(h.absmax1), bytes(g.absmax1)) << "absmax1, step " << s;
      EXPECT_EQ(bytes(h.absmax2), bytes(g.absmax2)) << "absmax2, step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Optim8bitCuda,
    ::testing::Values(Case{"f32_4128_wd", 4128, DType::kF32, DType::kF32, 0.01},
                      Case{"bf16_71x229", 71 * 229, DType::kBF16, DType::kBF16, 0.0},
                      Case{"f32_bf16grad_65536", 65536, DType::kF32, DType::kBF16, 0.1},
                      Case{"f32_small_992_wd", 992, DType::kF32, DType::kF32, 0.01},
                      Case{"bf16_small_19", 19, DType::kBF16, DType::kF32, 0.0},
                      Case{"bf16_sr_71x229", 71 * 229, DType::kBF16, DType::kBF16, 0.01, true},
                      Case{"bf16_sr_small_19", 19, DType::kBF16, DType::kF32, 0.0, true}),
    [](const auto& info) { return info.param.name; });

TEST(Optim8bitCuda, PagedOptimizerOnTheDeviceMatchesTheHost) {
  // paged_adamw_8bit / paged_adamw_32bit on a device: states in pinned host memory, paged through
  // two device slots in slabs (here of 2048 elements: 8 slabs, the copy of each overlapping the
  // step of the one before on the copy stream); the result equals the CPU optimizer's bit for
  // bit, and the states stay on the host, pinned.
  LT_SKIP_WITHOUT_CUDA();
  for (int64_t slab : {int64_t{2048}, kernels::kPagedSlabElements})
    for (bool eight : {true, false}) {
      Tensor hp = testing::randn({71, 229}, DType::kBF16, 21, Device::cpu(), 0.1);
      Tensor dp = hp.to(Device::cuda(0));
      kernels::AdamW8bit host({{"w", hp, true}}, AdamWConfig{1e-3, 0.9, 0.999, 1e-8, 0.01},
                              kernels::AdamW8bitOptions{eight, false});
      kernels::AdamW8bit dev({{"w", dp, true}}, AdamWConfig{1e-3, 0.9, 0.999, 1e-8, 0.01},
                             kernels::AdamW8bitOptions{eight, true, slab});
      for (int s = 1; s <= 3; ++s) {
        const Tensor g = testing::randn({71, 229}, DType::kBF16, 200 + s, Device::cpu(), 0.01);
        hp.set_grad(g);
        dp.set_grad(g.to(Device::cuda(0)));
        host.step(1e-3);
        dev.step(1e-3);
      }
      EXPECT_EQ(bytes(hp), bytes(dp)) << (eight ? "8-bit" : "32-bit") << ", slab " << slab;
      const auto hs = host.state_tensors(), ds = dev.state_tensors();
      ASSERT_EQ(hs.size(), ds.size());
      for (size_t k = 0; k < ds.size(); ++k) {
        EXPECT_TRUE(ds[k].second.device().is_cpu()) << ds[k].first;
        EXPECT_TRUE(ds[k].second.storage()->is_pinned()) << ds[k].first;
        EXPECT_EQ(bytes(hs[k].second), bytes(ds[k].second)) << ds[k].first << ", slab " << slab;
      }
    }
}

}  // namespace
}  // namespace leantune
