// Activation offloading on a CUDA device: device -> pinned copies on the side stream with
// events, the stash and its back-pressure, reloads prefetched during backward, and gradients
// equal to a run without offloading. Skipped without a device.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "engine/autograd.h"
#include "engine/offload.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear.h"
#include "kernels/residual.h"
#include "kernels/rms_norm.h"
#include "kernels/swiglu.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::randn;

Device gpu() { return Device::cuda(0); }
int64_t device_activation_bytes() {
  return allocator(gpu()).stats().tag(MemTag::kActivation).current;
}
int64_t pinned_activation_bytes() {
  return pinned_allocator().stats().tag(MemTag::kActivation).current;
}

Tensor device_activation(const Shape& shape, uint64_t seed, DType dt = DType::kF32) {
  Tensor t = Tensor::empty(shape, dt, gpu(), MemTag::kActivation);
  t.copy_(randn(shape, dt, seed));
  return t;
}

OffloadOptions on_gpu() {
  OffloadOptions o;
  o.device = gpu();
  return o;
}

TEST(ActivationOffloadCuda, RoundTripIsBitIdenticalAndReleasesDeviceMemory) {
  LT_SKIP_WITHOUT_CUDA();
  const int64_t dev0 = device_activation_bytes(), pin0 = pinned_activation_bytes();
  OffloadOptions o = on_gpu();
  o.max_fwd_stash_size = 0;  // every source is released as soon as its copy is queued
  ActivationOffloader off(o);
  std::vector<SavedTensor> saved;
  std::vector<std::vector<float>> expected;
  {
    Tensor a = device_activation({256, 1024}, 1);               // 1 MiB
    Tensor b = device_activation({512, 512}, 2, DType::kBF16);  // 512 KiB
    const std::vector<Tensor> views = {a, b.transpose(0, 1), a.narrow(0, 3, 100)};
    for (const Tensor& v : views) {
      expected.push_back(v.contiguous().to_f32());
      saved.emplace_back(v);
    }
  }
  const OffloadStats st = off.stats();
  EXPECT_EQ(st.tensors_offloaded, 2);
  EXPECT_EQ(st.views_deduplicated, 1);
  EXPECT_EQ(st.bytes_offloaded, (1 << 20) + (1 << 19));
  EXPECT_LE(st.stash_waits, 2);  // fewer when a copy finished before the next pack
  // The allocator counts the blocks as free; it hands them out again only after the copies.
  EXPECT_EQ(device_activation_bytes() - dev0, 0);
  EXPECT_EQ(pinned_activation_bytes() - pin0, (1 << 20) + (1 << 19));
  for (size_t i = 0; i < saved.size(); ++i) {
    Tensor u = saved[i].unpack();
    EXPECT_EQ(u.device(), gpu()) << i;
    EXPECT_EQ(u.contiguous().to_f32(), expected[i]) << i;
  }
  EXPECT_EQ(off.stats().restores_on_demand, 2);
  EXPECT_EQ(off.stats().bytes_restored, (1 << 20) + (1 << 19));
  EXPECT_EQ(off.stats().host_bytes_current, 0);
}

TEST(ActivationOffloadCuda, StashBoundsTheCopiesInFlight) {
  LT_SKIP_WITHOUT_CUDA();
  const int64_t dev0 = device_activation_bytes();
  OffloadOptions o = on_gpu();
  o.max_fwd_stash_size = 2;
  std::vector<SavedTensor> saved;
  std::vector<std::vector<float>> expected;
  {
    ActivationOffloader off(o);
    for (int i = 0; i < 6; ++i) {
      Tensor t = device_activation({1024, 1024}, 10 + i);  // 4 MiB
      expected.push_back(t.to_f32());
      saved.emplace_back(t);
      // Sources are dropped here; at most two stay referenced by the stash.
      EXPECT_LE(device_activation_bytes() - dev0, 2 * (4 << 20)) << i;
    }
    for (size_t i = 0; i < saved.size(); ++i) EXPECT_EQ(saved[i].unpack().to_f32(), expected[i]);
    const OffloadStats st = off.stats();
    EXPECT_EQ(st.tensors_offloaded, 6);
    EXPECT_EQ(st.stash_hits + st.restores_on_demand, 6);
  }
  saved.clear();
  EXPECT_EQ(device_activation_bytes() - dev0, 0);
}

// Decoder-like layers from the CUDA kernels: h + down(swiglu(gate(norm(h)), up(norm(h)))), then
// a head and cross entropy inside the no-offload scope.
struct GpuStack {
  static constexpr int64_t kRows = 256, kHidden = 256, kInter = 512, kVocab = 512;
  std::vector<std::vector<Tensor>> layers;  // norm, gate, up, down
  Tensor head, input, targets;
  std::vector<Tensor> params;

  explicit GpuStack(int n) {
    uint64_t seed = 100;
    auto param = [&](const Shape& s, double std) {
      Tensor p = Tensor::empty(s, DType::kF32, gpu(), MemTag::kParam);
      p.copy_(randn(s, DType::kF32, seed++, Device::cpu(), std));
      p.set_param(true).set_requires_grad(true);
      params.push_back(p);
      return p;
    };
    for (int l = 0; l < n; ++l) {
      Tensor norm = param({kHidden}, 0.1);
      norm.detach().copy_(Tensor::full({kHidden}, 1.0, DType::kF32));
      layers.push_back({norm, param({kInter, kHidden}, 0.05), param({kInter, kHidden}, 0.05),
                        param({kHidden, kInter}, 0.05)});
    }
    head = param({kVocab, kHidden}, 0.05);
    input = device_activation({kRows, kHidden}, 7);
    std::vector<int64_t> tg(kRows);
    for (int64_t i = 0; i < kRows; ++i) tg[i] = (i * 37) % kVocab;
    targets = Tensor::from_vector(tg, {kRows}, gpu());
  }
  Tensor layer(size_t l, const Tensor& h) const {
    const auto& w = layers[l];
    Tensor x = kernels::rms_norm(h, w[0], 1e-5);
    Tensor m = kernels::swiglu(kernels::linear(x, w[1]), kernels::linear(x, w[2]));
    return kernels::residual_add(h, kernels::linear(m, w[3]));
  }
  struct Result {
    std::vector<std::vector<float>> grads;
    int64_t activation_after_forward = 0;
  };
  Result step(bool ckpt) const {
    for (Tensor p : params) p.zero_grad();
    const int64_t dev0 = device_activation_bytes();
    Tensor h = input;
    for (size_t l = 0; l < layers.size(); ++l) {
      OffloadLayerScope scope(static_cast<int64_t>(l));
      if (ckpt) {
        auto fn = [this, l](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{layer(l, in[0])};
        };
        h = checkpoint(fn, {h})[0];
      } else {
        h = layer(l, h);
      }
    }
    Tensor loss;
    {
      NoOffloadScope no;
      loss = kernels::cross_entropy(kernels::linear(h, head), targets, kRows);
    }
    h = Tensor();
    device_synchronize(gpu());
    Result r;
    r.activation_after_forward = device_activation_bytes() - dev0;
    loss.backward();
    for (const Tensor& p : params) r.grads.push_back(p.grad().to_f32());
    return r;
  }
};

TEST(ActivationOffloadCuda, GradientsMatchAndReloadsArePrefetched) {
  LT_SKIP_WITHOUT_CUDA();
  GpuStack stack(4);
  const GpuStack::Result base = stack.step(false);
  for (bool ckpt : {false, true}) {
    OffloadStats st;
    GpuStack::Result r;
    {
      ActivationOffloader off(on_gpu());
      r = stack.step(ckpt);
      st = off.stats();
    }
    ASSERT_EQ(r.grads.size(), base.grads.size());
    for (size_t i = 0; i < r.grads.size(); ++i) {
      const Tensor a = Tensor::from_vector(r.grads[i], {static_cast<int64_t>(r.grads[i].size())});
      const Tensor e =
          Tensor::from_vector(base.grads[i], {static_cast<int64_t>(base.grads[i].size())});
      EXPECT_TRUE(testing::all_close(a, e, testing::tol(DType::kF32)))
          << "checkpointing " << ckpt << ", parameter " << i;
    }
    EXPECT_GT(st.tensors_offloaded, 0) << ckpt;
    // Reloads for layers below the top one start ahead of use; a copy still in the stash when
    // backward begins is used in place instead.
    EXPECT_GT(st.prefetches, 0) << ckpt;
    EXPECT_LE(st.prefetches + st.restores_on_demand, st.tensors_offloaded) << ckpt;
    EXPECT_EQ(st.host_bytes_current, 0) << ckpt;
  }
}

TEST(ActivationOffloadCuda, ActivationsLeaveTheDeviceBetweenForwardAndBackward) {
  LT_SKIP_WITHOUT_CUDA();
  GpuStack stack(4);
  const GpuStack::Result base = stack.step(false);
  OffloadOptions o = on_gpu();
  o.max_fwd_stash_size = 0;
  OffloadStats st;
  GpuStack::Result r;
  {
    ActivationOffloader off(o);
    r = stack.step(false);
    st = off.stats();
  }
  // Left on the device: the head's inputs and logits (no-offload scope) and small tensors.
  const int64_t rows_f32 = GpuStack::kRows * 4;
  EXPECT_LE(r.activation_after_forward,
            rows_f32 * (GpuStack::kHidden + GpuStack::kVocab) + 64 * 1024);
  EXPECT_GT(base.activation_after_forward, 4 * r.activation_after_forward);
  EXPECT_EQ(st.host_bytes_peak, st.bytes_offloaded);
}

}  // namespace
}  // namespace leantune
