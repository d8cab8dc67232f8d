// Activation offloading on a small DecoderModel (CPU): every parameter gradient is bit-identical
// with offloading, with gradient checkpointing and with both; the activation bytes held on the
// training device between forward and backward fall to the head's; the pinned pool holds them;
// LoRA-style adapters on frozen weights work the same.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/offload.h"
#include "engine/rng.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/rms_norm.h"
#include "loaders/model_config.h"
#include "models/decoder.h"
#include "testing/functional.h"
#include "testing/testing.h"

namespace leantune {
namespace {

int64_t device_activation_bytes() {
  return allocator(Device::cpu()).stats().tag(MemTag::kActivation).current;
}
int64_t pinned_activation_bytes() {
  return pinned_allocator().stats().tag(MemTag::kActivation).current;
}

constexpr int kLayers = 4;

std::unique_ptr<DecoderModel> tiny_model() {
  ModelConfig cfg = ModelConfig::load(testing::fixture_path("models/llama_gqa/model"));
  cfg.num_hidden_layers = kLayers;
  auto m = std::make_unique<DecoderModel>(cfg, Device::cpu(), DType::kF32);
  m->init_random(7);
  m->set_requires_grad(true);
  return m;
}

// Two sequences (40 and 24 tokens) with a few ignored labels.
Batch make_batch(int64_t vocab) {
  const std::vector<int64_t> lengths = {40, 24};
  Generator gen(11);
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu = {0};
  for (int64_t len : lengths) {
    for (int64_t i = 0; i < len; ++i) {
      const auto id = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(vocab)));
      ids.push_back(id);
      pos.push_back(i);
      labels.push_back(i % 7 == 3 ? kernels::kIgnoreIndex : id);
    }
    cu.push_back(cu.back() + static_cast<int32_t>(len));
  }
  const auto t = static_cast<int64_t>(ids.size());
  Batch b;
  b.input_ids = Tensor::from_vector(ids, {t});
  b.position_ids = Tensor::from_vector(pos, {t});
  b.labels = Tensor::from_vector(labels, {t});
  b.cu_seqlens = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  b.max_seqlen = 40;
  return b;
}

// DecoderModel::forward (fused loss) with the scopes the model enters: OffloadLayerScope(l)
// around each layer, NoOffloadScope around the final norm, the LM head and the loss.
Tensor scoped_loss(const DecoderModel& m, const Batch& b, bool checkpointing) {
  const int64_t max_seqlen = b.max_seqlen;
  const Tensor pos = b.position_ids, cu = b.cu_seqlens;
  Tensor h = m.embed(b.input_ids);
  for (int64_t l = 0; l < m.num_layers(); ++l) {
    OffloadLayerScope layer(l);
    if (checkpointing) {
      auto fn = [&m, l, pos, cu, max_seqlen](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{m.layer_forward(l, in[0], pos, cu, max_seqlen)};
      };
      h = checkpoint(fn, {h})[0];
    } else {
      h = m.layer_forward(l, h, pos, cu, max_seqlen);
    }
  }
  NoOffloadScope head;
  Tensor x = kernels::rms_norm(h, m.final_norm(), m.config().rms_norm_eps);
  Tensor targets = kernels::shift_labels(b.labels, b.cu_seqlens);
  int64_t n = 0;
  for (int64_t v : targets.to_i64()) n += v != kernels::kIgnoreIndex;
  return kernels::linear_cross_entropy(x, m.lm_head_weight(), targets, static_cast<double>(n));
}

struct StepResult {
  double loss = 0;
  std::vector<std::pair<std::string, std::vector<float>>> grads;
  int64_t activation_after_forward = 0;  // device kActivation bytes held, relative to before
  int64_t pinned_after_forward = 0;      // pinned-pool kActivation bytes, relative to before
  int64_t activation_peak = 0;           // device kActivation peak over the step, relative
  OffloadStats stats;
};

enum class Mode { kScoped, kModelForward };

StepResult train_step(DecoderModel& m, const Batch& b, bool checkpointing, bool offload,
                      Mode mode = Mode::kScoped, const std::vector<Tensor>* only = nullptr) {
  for (auto& [name, p] : m.named_parameters()) p.zero_grad();
  if (only)
    for (Tensor t : *only) t.zero_grad();
  StepResult r;
  allocator(Device::cpu()).reset_peak_stats();
  const int64_t dev0 = device_activation_bytes(), pin0 = pinned_activation_bytes();
  std::optional<ActivationOffloader> off;
  if (offload) off.emplace();
  Tensor loss;
  if (mode == Mode::kScoped) {
    loss = scoped_loss(m, b, checkpointing);
  } else {
    ForwardOptions fo;
    fo.gradient_checkpointing = checkpointing;
    loss = m.forward(b, fo).loss;
  }
  r.activation_after_forward = device_activation_bytes() - dev0;
  r.pinned_after_forward = pinned_activation_bytes() - pin0;
  r.loss = loss.item();
  loss.backward();
  r.activation_peak = allocator(Device::cpu()).stats().tag(MemTag::kActivation).peak - dev0;
  if (off) r.stats = off->stats();
  off.reset();
  for (auto& [name, p] : m.named_parameters())
    if (p.grad().defined()) r.grads.emplace_back(name, p.grad().to_f32());
  if (only)
    for (size_t i = 0; i < only->size(); ++i)
      r.grads.emplace_back("extra." + std::to_string(i), (*only)[i].grad().to_f32());
  return r;
}

::testing::AssertionResult same_grads(const StepResult& a, const StepResult& e) {
  if (a.grads.size() != e.grads.size())
    return ::testing::AssertionFailure() << a.grads.size() << " gradients vs " << e.grads.size();
  for (size_t i = 0; i < a.grads.size(); ++i) {
    const auto& [name, g] = a.grads[i];
    const auto& ge = e.grads[i].second;
    if (name != e.grads[i].first || g.size() != ge.size())
      return ::testing::AssertionFailure() << name << " vs " << e.grads[i].first;
    if (std::memcmp(g.data(), ge.data(), g.size() * sizeof(float)) != 0) {
      size_t j = 0;
      while (j < g.size() && g[j] == ge[j]) ++j;
      return ::testing::AssertionFailure()
             << name << " differs at " << j << ": " << g[j] << " vs " << ge[j];
    }
  }
  return ::testing::AssertionSuccess();
}

class OffloadModel : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tiny_model();
    batch_ = make_batch(model_->config().vocab_size);
  }
  std::unique_ptr<DecoderModel> model_;
  Batch batch_;
};

TEST_F(OffloadModel, ScopedForwardIsTheModelsForward) {
  const StepResult scoped = train_step(*model_, batch_, false, false, Mode::kScoped);
  const StepResult plain = train_step(*model_, batch_, false, false, Mode::kModelForward);
  EXPECT_EQ(scoped.loss, plain.loss);
  EXPECT_TRUE(same_grads(scoped, plain));
  EXPECT_EQ(plain.grads.size(), model_->named_parameters().size());
}

TEST_F(OffloadModel, GradientsEqualWithOffloadingCheckpointingAndBoth) {
  const StepResult base = train_step(*model_, batch_, false, false);
  for (bool ckpt : {false, true}) {
    for (bool offload : {false, true}) {
      const StepResult r = train_step(*model_, batch_, ckpt, offload);
      EXPECT_EQ(r.loss, base.loss) << "checkpointing " << ckpt << ", offloading " << offload;
      EXPECT_TRUE(same_grads(r, base)) << "checkpointing " << ckpt << ", offloading " << offload;
      if (offload) {
        EXPECT_GT(r.stats.tensors_offloaded, 0);
        EXPECT_EQ(r.stats.bytes_restored, r.stats.bytes_offloaded);
        EXPECT_EQ(r.stats.host_bytes_current, 0);
      }
    }
  }
}

TEST_F(OffloadModel, ModelForwardIsExactWithOrWithoutItsScopes) {
  // DecoderModel::forward itself, whether or not it enters the offload scopes yet. Without them
  // nothing is known about layers (every reload is on demand) and the loss's precomputed
  // dhidden moves too; with them every reload is prefetched. Gradients are unchanged.
  const StepResult base = train_step(*model_, batch_, false, false, Mode::kModelForward);
  for (bool ckpt : {false, true}) {
    const StepResult r = train_step(*model_, batch_, ckpt, true, Mode::kModelForward);
    EXPECT_TRUE(same_grads(r, base)) << "checkpointing " << ckpt;
    const OffloadStats& st = r.stats;
    const bool model_enters_scopes = st.skipped_no_offload > 0;
    EXPECT_EQ(st.prefetches, model_enters_scopes ? st.tensors_offloaded : 0) << ckpt;
    EXPECT_EQ(st.prefetches + st.restores_on_demand + st.stash_hits, st.tensors_offloaded) << ckpt;
  }
}

TEST_F(OffloadModel, ActivationsLeaveTheDeviceBetweenForwardAndBackward) {
  const int64_t t = batch_.num_tokens(), hsz = model_->config().hidden_size;
  const int64_t row_bytes = t * hsz * 4;  // one [T, H] f32 activation
  const StepResult base = train_step(*model_, batch_, false, false);
  const StepResult off = train_step(*model_, batch_, false, true);
  std::cout << "[ activation bytes after forward ] without offloading "
            << base.activation_after_forward << ", with offloading " << off.activation_after_forward
            << "; pinned pool " << off.pinned_after_forward << "; offloaded "
            << off.stats.tensors_offloaded << " tensors, " << off.stats.bytes_offloaded
            << " bytes; skipped " << off.stats.skipped() << " (small " << off.stats.skipped_small
            << ", param " << off.stats.skipped_param << ", no-offload "
            << off.stats.skipped_no_offload << ", grad " << off.stats.skipped_grad << ")\n";
  // What stays: the head's saved tensors (final norm input [T,H] and its rstd, the loss's
  // precomputed dhidden [T,H]), tensors under 1 KiB, and the scalar loss.
  EXPECT_GE(off.activation_after_forward, 2 * row_bytes);
  EXPECT_LE(off.activation_after_forward, 2 * row_bytes + 8 * 1024);
  EXPECT_GT(base.activation_after_forward, 10 * off.activation_after_forward);
  // Everything else moved into the pinned pool (whose blocks round up to 512 bytes).
  EXPECT_GE(off.pinned_after_forward, off.stats.bytes_offloaded);
  EXPECT_LE(off.pinned_after_forward,
            off.stats.bytes_offloaded + 512 * off.stats.tensors_offloaded);
  EXPECT_EQ(off.stats.host_bytes_peak, off.stats.bytes_offloaded);
  EXPECT_EQ(base.activation_after_forward - off.activation_after_forward,
            off.stats.bytes_offloaded);
  // Parameters never move: every saved weight was skipped.
  EXPECT_GT(off.stats.skipped_param, 0);
  EXPECT_GE(off.stats.skipped_no_offload, 3);  // norm x, norm rstd, dhidden (+ dweight)
  // Every reload of a layer was started ahead of its use.
  EXPECT_EQ(off.stats.prefetches, off.stats.tensors_offloaded);
  EXPECT_EQ(off.stats.restores_on_demand, 0);
}

TEST_F(OffloadModel, WithCheckpointingOnlyLayerInputsMove) {
  const int64_t row_bytes = batch_.num_tokens() * model_->config().hidden_size * 4;
  const StepResult ckpt = train_step(*model_, batch_, true, false);
  const StepResult both = train_step(*model_, batch_, true, true);
  std::cout << "[ activation bytes after forward, checkpointing ] without offloading "
            << ckpt.activation_after_forward << ", with offloading "
            << both.activation_after_forward << "; pinned pool " << both.pinned_after_forward
            << "\n";
  // One input per layer: the embedding output and the outputs of layers 0..2.
  EXPECT_EQ(both.stats.tensors_offloaded, kLayers);
  EXPECT_EQ(both.stats.bytes_offloaded, kLayers * row_bytes);
  EXPECT_EQ(ckpt.activation_after_forward - both.activation_after_forward, kLayers * row_bytes);
  EXPECT_EQ(both.stats.prefetches, kLayers);
}

TEST_F(OffloadModel, CheckpointingKeepsLayerInputsPlusOneLayer) {
  const int64_t row_bytes = batch_.num_tokens() * model_->config().hidden_size * 4;
  const StepResult plain = train_step(*model_, batch_, false, false);
  const StepResult ckpt = train_step(*model_, batch_, true, false);
  // After forward: one [T, H] input per layer plus what the head keeps (its norm input, rstd
  // and the loss's dhidden: two rows and a little).
  const int64_t head = ckpt.activation_after_forward - kLayers * row_bytes;
  EXPECT_GE(head, 2 * row_bytes);
  EXPECT_LE(head, 2 * row_bytes + 8 * 1024);
  // One layer's saved activations, from the run without checkpointing.
  const int64_t layer = (plain.activation_after_forward - head) / kLayers;
  EXPECT_GT(layer, 4 * row_bytes);
  std::cout << "[ activation peak ] without checkpointing " << plain.activation_peak << ", with "
            << ckpt.activation_peak << "; layer inputs " << kLayers * row_bytes
            << ", one layer's activations " << layer << ", head " << head << "\n";
  // The peak: the inputs, the head, one recomputed layer and that layer's backward temporaries
  // (at most one more layer's worth), well under the peak without checkpointing.
  EXPECT_GE(ckpt.activation_peak, kLayers * row_bytes + head + layer - row_bytes);
  EXPECT_LE(ckpt.activation_peak, kLayers * row_bytes + head + 2 * layer);
  EXPECT_LT(ckpt.activation_peak, plain.activation_peak);
}

// LoRA on q_proj and v_proj: y = base(x) + (x A^T) B^T * scale, base weights frozen.
class TestLora final : public LinearAdapter {
 public:
  TestLora(int64_t in, int64_t out, int64_t r, uint64_t seed) {
    a = Tensor::empty({r, in}, DType::kF32, Device::cpu(), MemTag::kParam);
    b = Tensor::empty({out, r}, DType::kF32, Device::cpu(), MemTag::kParam);
    Generator gen(seed);
    normal_(a, gen, 0.0, 0.2);
    normal_(b, gen, 0.0, 0.2);  // non-zero so that A gets a gradient on the first step
    a.set_param(true).set_requires_grad(true);
    b.set_param(true).set_requires_grad(true);
  }
  Tensor forward(const Tensor& x, Tensor base_out) const override {
    return fn::add(base_out, fn::scale(kernels::linear(kernels::linear(x, a), b), 0.5));
  }
  Tensor a, b;
};

TEST_F(OffloadModel, LoraOnFrozenWeightsGivesTheSameAdapterGradients) {
  model_->set_requires_grad(false);
  std::vector<Tensor> trainable;
  uint64_t seed = 20;
  for (int64_t l = 0; l < model_->num_layers(); ++l) {
    for (LinearModule* m : {&model_->layer(l).q_proj, &model_->layer(l).v_proj}) {
      auto lora = std::make_shared<TestLora>(m->in_features, m->out_features, 4, seed++);
      trainable.push_back(lora->a);
      trainable.push_back(lora->b);
      m->adapter = lora;
    }
  }
  const StepResult base = train_step(*model_, batch_, false, false, Mode::kScoped, &trainable);
  ASSERT_EQ(base.grads.size(), trainable.size());  // only the adapters have gradients
  for (bool ckpt : {false, true}) {
    const StepResult r = train_step(*model_, batch_, ckpt, true, Mode::kScoped, &trainable);
    EXPECT_TRUE(same_grads(r, base)) << "checkpointing " << ckpt;
    EXPECT_GT(r.stats.tensors_offloaded, 0);
    // Without checkpointing, the frozen weights and the adapters are saved (and stay); with it
    // only the layer inputs are saved here.
    if (ckpt) {
      EXPECT_EQ(r.stats.tensors_offloaded, kLayers);
    } else {
      EXPECT_GT(r.stats.skipped_param, 0);
    }
  }
}

}  // namespace
}  // namespace leantune
