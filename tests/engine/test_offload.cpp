// Activation offloading on the CPU backend: which saved tensors move, where their bytes live
// (allocator stats of the training device and of the pinned pool), dedup of views, bit-exact
// restore, prefetch by layer, and gradients equal to those without offloading.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "engine/autograd.h"
#include "engine/offload.h"
#include "testing/functional.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::randn;

int64_t device_activation_bytes() {
  return allocator(Device::cpu()).stats().tag(MemTag::kActivation).current;
}
int64_t pinned_activation_bytes() {
  return pinned_allocator().stats().tag(MemTag::kActivation).current;
}

// The raw bytes a view covers, element by element (strided views included).
std::vector<uint8_t> view_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// A tensor in activation memory whose every bit matters (f32 patterns incl. negative zero).
Tensor activation(const Shape& shape, uint64_t seed, DType dt = DType::kF32) {
  Tensor r = randn(shape, dt, seed);
  Tensor t = Tensor::empty(shape, dt, Device::cpu(), MemTag::kActivation);
  t.copy_(r);
  return t;
}

TEST(ActivationOffload, UnpackReturnsBitIdenticalDataForViewsAndDtypes) {
  Tensor a = activation({32, 48}, 1);
  Tensor b = activation({40, 40}, 2, DType::kBF16);
  Tensor c = activation({16, 96}, 3, DType::kF64);
  std::vector<Tensor> saved_from = {a, a.transpose(0, 1), b.narrow(1, 3, 30), c.select(0, 5)};
  // c.select(0, 5) is 96 f64 = 768 bytes: below the default minimum.
  std::vector<std::vector<uint8_t>> expected;
  for (const Tensor& t : saved_from) expected.push_back(view_bytes(t));
  std::vector<SavedTensor> saved;
  OffloadStats st;
  {
    ActivationOffloader off;
    for (const Tensor& t : saved_from) saved.emplace_back(t);
    for (size_t i = 0; i < saved.size(); ++i) {
      Tensor u = saved[i].unpack();
      EXPECT_EQ(u.shape(), saved_from[i].shape()) << i;
      EXPECT_EQ(u.strides(), saved_from[i].strides()) << i;
      EXPECT_EQ(u.dtype(), saved_from[i].dtype()) << i;
      EXPECT_EQ(view_bytes(u), expected[i]) << i;
    }
    st = off.stats();
  }
  EXPECT_EQ(st.tensors_packed, 4);
  EXPECT_EQ(st.tensors_offloaded, 2);  // a (shared with its transpose) and b's storage
  EXPECT_EQ(st.views_deduplicated, 1);
  EXPECT_EQ(st.skipped_small, 1);
  // b.narrow(1, 3, 30): bytes [6, 39*80 + 66) of b's storage, copied from byte 0 (256-aligned).
  EXPECT_EQ(st.bytes_offloaded, 32 * 48 * 4 + (39 * 80 + 33 * 2));
}

TEST(ActivationOffload, MovesBytesFromTheDeviceAllocatorToThePinnedPool) {
  const int64_t dev0 = device_activation_bytes(), pin0 = pinned_activation_bytes();
  ActivationOffloader off;
  SavedTensor s;
  std::vector<uint8_t> expected;
  {
    Tensor x = activation({64, 256}, 4);  // 64 KiB
    expected = view_bytes(x);
    EXPECT_EQ(device_activation_bytes() - dev0, 65536);
    s = SavedTensor(x);
  }
  // Only the host copy remains.
  EXPECT_EQ(device_activation_bytes() - dev0, 0);
  EXPECT_EQ(pinned_activation_bytes() - pin0, 65536);
  EXPECT_EQ(off.stats().bytes_offloaded, 65536);
  EXPECT_EQ(off.stats().host_bytes_current, 65536);
  EXPECT_EQ(off.stats().host_bytes_peak, 65536);
  {
    Tensor u = s.unpack();
    EXPECT_EQ(view_bytes(u), expected);
    // Restored on the device; the host copy is released once its reload is queued.
    EXPECT_EQ(device_activation_bytes() - dev0, 65536);
    EXPECT_EQ(pinned_activation_bytes() - pin0, 0);
    EXPECT_EQ(off.stats().host_bytes_current, 0);
    EXPECT_EQ(off.stats().restores_on_demand, 1);
    EXPECT_EQ(off.stats().bytes_restored, 65536);
  }
  // A second unpack reuses the restored buffer.
  EXPECT_EQ(view_bytes(s.unpack()), expected);
  EXPECT_EQ(off.stats().restores_on_demand, 1);
  s.reset();
  EXPECT_EQ(device_activation_bytes() - dev0, 0);
}

TEST(ActivationOffload, MinOffloadSizeIsRespected) {
  const int64_t pin0 = pinned_activation_bytes();
  std::vector<SavedTensor> saved;
  ActivationOffloader off;                   // default: 1024 bytes
  saved.emplace_back(activation({255}, 5));  // 1020 bytes: stays
  saved.emplace_back(activation({256}, 6));  // 1024 bytes: moves
  EXPECT_EQ(off.stats().skipped_small, 1);
  EXPECT_EQ(off.stats().tensors_offloaded, 1);
  EXPECT_EQ(off.stats().bytes_offloaded, 1024);
  EXPECT_EQ(pinned_activation_bytes() - pin0, 1024);

  OffloadOptions big;
  big.min_offload_size = 8192;
  ActivationOffloader inner(big);
  saved.emplace_back(activation({2047}, 7));  // 8188 bytes
  saved.emplace_back(activation({2048}, 8));  // 8192 bytes
  EXPECT_EQ(inner.stats().skipped_small, 1);
  EXPECT_EQ(inner.stats().bytes_offloaded, 8192);
  // The outer offloader saw nothing while the inner one was on top.
  EXPECT_EQ(off.stats().tensors_packed, 2);
}

TEST(ActivationOffload, ParametersAndTheirStorageNeverMove) {
  const int64_t pin0 = pinned_activation_bytes();
  Tensor w = Tensor::empty({64, 64}, DType::kF32, Device::cpu(), MemTag::kParam);
  w.fill_(0.5).set_param(true).set_requires_grad(true);
  // Parameter storage without the is_param flag: the tag tells.
  Tensor tagged = Tensor::empty({64, 64}, DType::kF32, Device::cpu(), MemTag::kParam);
  std::vector<float> host(4096, 1.0f);
  Tensor mapped = Tensor::from_blob(host.data(), {64, 64}, DType::kF32, Device::cpu(),
                                    std::make_shared<int>(0));  // external (mmapped) storage
  ActivationOffloader off;
  std::vector<SavedTensor> saved;
  saved.emplace_back(w);
  saved.emplace_back(w.transpose(0, 1));
  saved.emplace_back(w.narrow(0, 8, 32));
  saved.emplace_back(tagged);
  saved.emplace_back(mapped);
  EXPECT_EQ(off.stats().skipped_param, 5);
  EXPECT_EQ(off.stats().tensors_offloaded, 0);
  EXPECT_EQ(pinned_activation_bytes() - pin0, 0);
  EXPECT_TRUE(saved[1].unpack().shares_storage(w));
  EXPECT_EQ(saved[2].unpack().data_ptr(), w.narrow(0, 8, 32).data_ptr());
}

TEST(ActivationOffload, GradientsComputedInForwardStay) {
  Tensor g = Tensor::zeros({64, 64}, DType::kF32, Device::cpu(), MemTag::kGrad);
  ActivationOffloader off;
  SavedTensor s(g);
  EXPECT_EQ(off.stats().skipped_grad, 1);
  EXPECT_EQ(off.stats().tensors_offloaded, 0);
  EXPECT_TRUE(s.unpack().shares_storage(g));
}

TEST(ActivationOffload, NoOffloadScopeKeepsTensorsInPlace) {
  const int64_t dev0 = device_activation_bytes();
  ActivationOffloader off;
  std::vector<SavedTensor> saved;
  {
    NoOffloadScope head;
    saved.emplace_back(activation({64, 64}, 9));
    {
      NoOffloadScope nested;
      saved.emplace_back(activation({64, 64}, 10));
    }
    EXPECT_TRUE(in_no_offload_scope());
    saved.emplace_back(activation({64, 64}, 11));
  }
  EXPECT_FALSE(in_no_offload_scope());
  EXPECT_EQ(off.stats().skipped_no_offload, 3);
  EXPECT_EQ(device_activation_bytes() - dev0, 3 * 16384);
  saved.emplace_back(activation({64, 64}, 12));
  EXPECT_EQ(off.stats().tensors_offloaded, 1);
  EXPECT_EQ(device_activation_bytes() - dev0, 3 * 16384);
}

TEST(ActivationOffload, TensorsAlreadyInPinnedMemoryStay) {
  Tensor p = Tensor::empty_pinned({64, 64}, DType::kF32, MemTag::kActivation);
  p.fill_(2.0);
  ActivationOffloader off;
  SavedTensor s(p);
  EXPECT_EQ(off.stats().skipped_host, 1);
  EXPECT_TRUE(s.unpack().shares_storage(p));
}

TEST(ActivationOffload, ViewsOfOneStorageMoveOnce) {
  const int64_t pin0 = pinned_activation_bytes(), dev0 = device_activation_bytes();
  ActivationOffloader off;
  std::vector<SavedTensor> saved;
  std::vector<Tensor> views;
  {
    Tensor x = activation({64, 64}, 13);  // 16 KiB
    views = {x, x.transpose(0, 1), x.narrow(0, 8, 16), x.narrow(1, 0, 16)};
    for (const Tensor& v : views) saved.emplace_back(v);
  }
  std::vector<std::vector<uint8_t>> expected;
  for (const Tensor& v : views) expected.push_back(view_bytes(v));
  views.clear();
  EXPECT_EQ(off.stats().tensors_offloaded, 1);
  EXPECT_EQ(off.stats().views_deduplicated, 3);
  EXPECT_EQ(off.stats().bytes_offloaded, 16384);
  EXPECT_EQ(pinned_activation_bytes() - pin0, 16384);
  EXPECT_EQ(device_activation_bytes() - dev0, 0);

  std::vector<Tensor> back;
  for (size_t i = 0; i < saved.size(); ++i) {
    back.push_back(saved[i].unpack());
    EXPECT_EQ(view_bytes(back[i]), expected[i]) << i;
  }
  // One reload, and every view is a view of it.
  EXPECT_EQ(off.stats().restores_on_demand, 1);
  EXPECT_EQ(off.stats().bytes_restored, 16384);
  for (size_t i = 1; i < back.size(); ++i) EXPECT_TRUE(back[i].shares_storage(back[0])) << i;
  EXPECT_EQ(device_activation_bytes() - dev0, 16384);
}

TEST(ActivationOffload, AViewOutsideEarlierCopiesGetsItsOwnCopy) {
  ActivationOffloader off;
  std::vector<SavedTensor> saved;
  Tensor x = activation({64, 64}, 14);
  saved.emplace_back(x.narrow(0, 8, 16));  // bytes [2048, 6144)
  saved.emplace_back(x);                   // not inside the first copy
  saved.emplace_back(x.narrow(0, 10, 4));  // inside both
  EXPECT_EQ(off.stats().tensors_offloaded, 2);
  EXPECT_EQ(off.stats().bytes_offloaded, 4096 + 16384);
  EXPECT_EQ(off.stats().views_deduplicated, 1);
  EXPECT_EQ(view_bytes(saved[2].unpack()), view_bytes(x.narrow(0, 10, 4)));
  // A new storage at a reused address is not mistaken for the old one.
  saved.clear();
  x = Tensor();
  Tensor y = activation({64, 64}, 15);
  SavedTensor sy(y);
  EXPECT_EQ(off.stats().tensors_offloaded, 3);
  EXPECT_EQ(view_bytes(sy.unpack()), view_bytes(y));
}

TEST(ActivationOffload, ScopesAreCheapNoOpsWithoutAnOffloader) {
  EXPECT_FALSE(activation_offloading_active());
  EXPECT_EQ(current_offload_layer(), -1);
  {
    OffloadLayerScope layer(3);
    EXPECT_EQ(current_offload_layer(), 3);
    {
      OffloadLayerScope inner(4);
      EXPECT_EQ(current_offload_layer(), 4);
    }
    EXPECT_EQ(current_offload_layer(), 3);
    NoOffloadScope head;
    Tensor x = activation({64, 64}, 16);
    SavedTensor s(x);
    EXPECT_TRUE(s.unpack().shares_storage(x));
  }
  EXPECT_EQ(current_offload_layer(), -1);
  {
    ActivationOffloader off;
    EXPECT_TRUE(activation_offloading_active());
  }
  EXPECT_FALSE(activation_offloading_active());
  EXPECT_EQ(current_saved_tensor_hooks(), nullptr);
}

TEST(ActivationOffload, RejectsBadOptions) {
  OffloadOptions o;
  o.min_offload_size = -1;
  EXPECT_THROW(ActivationOffloader{o}, Error);
  o = {};
  o.max_fwd_stash_size = -2;
  EXPECT_THROW(ActivationOffloader{o}, Error);
  if (!cuda_available()) {
    o = {};
    o.device = Device::cuda(0);
    EXPECT_THROW(ActivationOffloader{o}, Error);
  }
  EXPECT_EQ(current_saved_tensor_hooks(), nullptr);
}

// ---- graphs: layers of y = tanh(x W_l) * x, loss = sum(y^2)

struct Chain {
  std::vector<Tensor> weights;
  Tensor input;
  Chain(int layers, int64_t rows, int64_t width) {
    for (int l = 0; l < layers; ++l) {
      Tensor w = randn({width, width}, DType::kF64, 100 + l, Device::cpu(), 0.3);
      Tensor p = Tensor::empty(w.shape(), DType::kF64, Device::cpu(), MemTag::kParam);
      p.copy_(w);
      p.set_param(true).set_requires_grad(true);
      weights.push_back(p);
    }
    input = randn({rows, width}, DType::kF64, 99);
    input.set_requires_grad(true);
  }
  Tensor layer(int l, const Tensor& x) const {
    return fn::mul(fn::tanh(fn::matmul(x, weights[l])), x);
  }
  // forward + backward; gradients of the weights and the input, flattened.
  std::vector<double> grads(bool scopes, bool ckpt,
                            int64_t* activation_after_forward = nullptr) const {
    for (Tensor t : weights) t.zero_grad();
    Tensor in = input;
    in.zero_grad();
    const int64_t dev0 = device_activation_bytes();
    Tensor h = input;
    for (size_t l = 0; l < weights.size(); ++l) {
      std::optional<OffloadLayerScope> scope;
      if (scopes) scope.emplace(static_cast<int64_t>(l));
      if (ckpt) {
        auto fwd = [this, l](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{layer(static_cast<int>(l), in[0])};
        };
        h = checkpoint(fwd, {h})[0];
      } else {
        h = layer(static_cast<int>(l), h);
      }
    }
    Tensor loss;
    {
      NoOffloadScope head;
      loss = fn::sum(fn::square(h));
    }
    h = Tensor();
    if (activation_after_forward) *activation_after_forward = device_activation_bytes() - dev0;
    loss.backward();
    std::vector<double> out;
    for (const Tensor& w : weights) {
      std::vector<double> g = w.grad().to_f64();
      out.insert(out.end(), g.begin(), g.end());
    }
    std::vector<double> gi = input.grad().to_f64();
    out.insert(out.end(), gi.begin(), gi.end());
    return out;
  }
};

TEST(ActivationOffload, GradientsEqualWithOffloadingCheckpointingAndBoth) {
  Chain chain(4, 48, 32);
  const std::vector<double> plain = chain.grads(true, false);
  for (bool ckpt : {false, true}) {
    for (bool offload : {false, true}) {
      std::optional<ActivationOffloader> off;
      if (offload) off.emplace();
      const std::vector<double> g = chain.grads(true, ckpt);
      ASSERT_EQ(g.size(), plain.size());
      EXPECT_EQ(std::memcmp(g.data(), plain.data(), g.size() * sizeof(double)), 0)
          << "checkpointing " << ckpt << ", offloading " << offload;
      if (off) {
        EXPECT_GT(off->stats().tensors_offloaded, 0);
        // Every host copy came back and was released with its nodes.
        EXPECT_EQ(off->stats().host_bytes_current, 0);
        EXPECT_EQ(off->stats().bytes_restored, off->stats().bytes_offloaded);
      }
    }
  }
}

TEST(ActivationOffload, GradientsEqualUnderEveryOption) {
  Chain chain(3, 48, 32);
  const std::vector<double> plain = chain.grads(true, false);
  OffloadOptions no_streams, no_stash, everything, no_prefetch;
  no_streams.use_streams = false;
  no_stash.max_fwd_stash_size = 0;
  everything.min_offload_size = 0;  // small tensors (the scalar loss's inputs) move too
  no_prefetch.prefetch = false;
  int i = 0;
  for (const OffloadOptions& o : {no_streams, no_stash, everything, no_prefetch}) {
    for (bool ckpt : {false, true}) {
      ActivationOffloader off(o);
      const std::vector<double> g = chain.grads(true, ckpt);
      ASSERT_EQ(g.size(), plain.size());
      EXPECT_EQ(std::memcmp(g.data(), plain.data(), g.size() * sizeof(double)), 0)
          << "options " << i << ", checkpointing " << ckpt;
      EXPECT_EQ(off.stats().host_bytes_current, 0) << i;
    }
    ++i;
  }
}

TEST(ActivationOffload, ActivationBytesLeaveTheDeviceBetweenForwardAndBackward) {
  Chain chain(4, 64, 32);  // [64, 32] f64 = 16 KiB per saved activation
  int64_t kept = 0, moved = 0;
  chain.grads(true, false, &kept);
  OffloadStats st;
  {
    ActivationOffloader off;
    chain.grads(true, false, &moved);
    st = off.stats();
  }
  // Per layer l: matmul saves x_l and W_l, tanh saves t_l, mul saves t_l and x_l again.
  // x_0 is the chain's input (held by the chain), x_l = y_(l-1) the output of layer l-1. The
  // last output y_3 is saved by square() inside the no-offload scope.
  EXPECT_EQ(st.tensors_packed, 4 * 5 + 1);
  EXPECT_EQ(st.skipped_param, 4);
  EXPECT_EQ(st.skipped_no_offload, 1);
  EXPECT_EQ(st.views_deduplicated, 4 * 2);
  EXPECT_EQ(st.tensors_offloaded, 8);  // x_0, t_0..t_3, y_0..y_2
  EXPECT_EQ(st.bytes_offloaded, 8 * 16384);
  EXPECT_EQ(st.host_bytes_peak, 8 * 16384);
  // t_0..t_3 and y_0..y_2 left the device; y_3 and the scalar loss stayed.
  EXPECT_GE(kept, 8 * 16384);
  EXPECT_EQ(kept - moved, 7 * 16384);
  EXPECT_LT(moved, 16384 + 1024);
}

TEST(ActivationOffload, BackwardPrefetchesTheNextLayer) {
  Chain chain(4, 48, 32);
  OffloadStats with_scopes, without_scopes, no_streams;
  {
    ActivationOffloader off;
    chain.grads(true, false);
    with_scopes = off.stats();
  }
  // Every reload was started ahead of its use: at the loss node for the last layer, then at
  // layer L for layer L-1.
  EXPECT_GT(with_scopes.tensors_offloaded, 0);
  EXPECT_EQ(with_scopes.prefetches, with_scopes.tensors_offloaded);
  EXPECT_EQ(with_scopes.restores_on_demand, 0);
  {
    ActivationOffloader off;
    chain.grads(false, false);
    without_scopes = off.stats();
  }
  // No layer information: every reload is on demand.
  EXPECT_EQ(without_scopes.prefetches, 0);
  EXPECT_EQ(without_scopes.restores_on_demand, without_scopes.tensors_offloaded);
  {
    OffloadOptions o;
    o.use_streams = false;
    ActivationOffloader off(o);
    chain.grads(true, false);
    no_streams = off.stats();
  }
  EXPECT_EQ(no_streams.prefetches, 0);
  EXPECT_EQ(no_streams.restores_on_demand, no_streams.tensors_offloaded);
}

// Records, at the first node of each layer's backward, which layers have been reloaded.
class ReloadWatcher final : public BackwardObserver {
 public:
  explicit ReloadWatcher(const ActivationOffloader& off) : off_(off) {}
  void before_node(Node& node) override { prefetches.push_back(off_.stats().prefetches); }
  std::vector<int64_t> prefetches;

 private:
  const ActivationOffloader& off_;
};

TEST(ActivationOffload, PrefetchRunsOneLayerAhead) {
  Chain chain(3, 48, 32);
  ActivationOffloader off;
  ReloadWatcher watch(off);  // runs after the offloader's observer
  add_backward_observer(&watch);
  chain.grads(true, false);
  remove_backward_observer(&watch);
  // Two host copies per layer (t_l and x_l). The loss node reloads layer 2; the first node of
  // layer 2 reloads layer 1; the first node of layer 1 reloads layer 0.
  const std::vector<int64_t>& p = watch.prefetches;
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p.front(), 2);
  EXPECT_EQ(p.back(), 6);
  for (size_t i = 1; i < p.size(); ++i)
    EXPECT_TRUE(p[i] - p[i - 1] == 0 || p[i] - p[i - 1] == 2) << i;
}

TEST(ActivationOffload, CheckpointingOffloadsOnlyLayerInputs) {
  Chain chain(4, 64, 32);
  int64_t kept = 0, moved = 0;
  chain.grads(true, true, &kept);
  ActivationOffloader off;
  chain.grads(true, true, &moved);
  // checkpoint() saves one input per layer (x_0, y_0, y_1, y_2); the recompute keeps everything
  // in place, so nothing else is packed here.
  EXPECT_EQ(off.stats().tensors_packed, 4 + 1);
  EXPECT_EQ(off.stats().tensors_offloaded, 4);
  EXPECT_EQ(off.stats().bytes_offloaded, 4 * 16384);
  EXPECT_EQ(off.stats().prefetches, 4);
  EXPECT_EQ(off.stats().restores_on_demand, 0);
  // y_0..y_2 left the device; y_3 (saved by the loss) stayed.
  EXPECT_EQ(kept - moved, 3 * 16384);
  EXPECT_LT(moved, 16384 + 1024);
}

TEST(ActivationOffload, GraphOutlivingTheScopeStaysRestorable) {
  Chain chain(2, 48, 32);
  const std::vector<double> plain = chain.grads(true, false);
  for (Tensor w : chain.weights) w.zero_grad();
  chain.input.zero_grad();
  Tensor loss;
  OffloadStats st;
  {
    ActivationOffloader off;
    Tensor h = chain.input;
    for (int l = 0; l < 2; ++l) {
      OffloadLayerScope scope(l);
      h = chain.layer(l, h);
    }
    loss = fn::sum(fn::square(h));
    st = off.stats();
  }
  EXPECT_GT(st.tensors_offloaded, 0);
  EXPECT_EQ(current_saved_tensor_hooks(), nullptr);
  loss.backward();
  std::vector<double> g;
  for (const Tensor& w : chain.weights) {
    std::vector<double> gw = w.grad().to_f64();
    g.insert(g.end(), gw.begin(), gw.end());
  }
  std::vector<double> gi = chain.input.grad().to_f64();
  g.insert(g.end(), gi.begin(), gi.end());
  ASSERT_EQ(g.size(), plain.size());
  EXPECT_EQ(std::memcmp(g.data(), plain.data(), g.size() * sizeof(double)), 0);
}

TEST(ActivationOffload, RetainedGraphRunsBackwardTwice) {
  Chain chain(2, 48, 32);
  chain.grads(true, false);
  const std::vector<double> once = chain.weights[0].grad().to_f64();
  chain.weights[0].zero_grad();
  ActivationOffloader off;
  Tensor h = chain.input;
  for (int l = 0; l < 2; ++l) {
    OffloadLayerScope scope(l);
    h = chain.layer(l, h);
  }
  Tensor loss = fn::sum(fn::square(h));
  loss.backward(Tensor(), /*retain_graph=*/true);
  loss.backward();
  const std::vector<double> twice = chain.weights[0].grad().to_f64();
  ASSERT_EQ(twice.size(), once.size());
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]) << i;
}

}  // namespace
}  // namespace leantune
