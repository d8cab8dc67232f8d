// Trainable tokens (PEFT's TrainableTokensLayer, `trainable_token_indices`): only a few rows of
// the embedding matrix train. The rows live in a small parameter `delta` [n, H] that starts as a
// copy of those rows (PEFT's init_weights=True) and REPLACES them in the forward pass (PEFT's
// index_copy; despite the name it is not added). embed_tokens itself stays frozen, so every
// other row is bit-identical after training and optimizer state exists for `delta` only.
//
// Attached to a DecoderModel through its embedding_override:
//   - the embedding lookup gathers from the frozen matrix and overwrites the positions whose id
//     is listed with their delta row; backward scatters those positions' gradients into
//     d delta (deterministic, f32 accumulation) -- nothing of size [V, H] is formed;
//   - with tied embeddings the head uses embed_tokens with the listed rows replaced, formed per
//     call ([V, H], as PEFT does); backward gathers the listed rows of the head's gradient.
// An untied lm_head is left alone (PEFT targets the input embedding for a plain index list).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/tensor.h"

namespace leantune {

class DecoderModel;

class TrainableTokens {
 public:
  // Indices must be unique and inside [0, vocab_size): an Error naming the option otherwise.
  // The delta is a copy of those rows (requires_grad, MemTag::kParam).
  TrainableTokens(const DecoderModel& model, std::vector<int64_t> indices);

  const std::vector<int64_t>& indices() const { return indices_; }
  const Tensor& delta() const { return delta_; }
  // Replaces delta's values (loading an adapter): [n, H], converted to delta's dtype.
  void load_delta(const Tensor& values);
  bool enabled() const { return enabled_; }
  // Disabled: the plain embedding (a reference-model pass).
  void set_enabled(bool on) { enabled_ = on; }

  // Differentiable with respect to delta only.
  Tensor embed(const Tensor& weight, const Tensor& ids) const;  // [T] -> [T, H]
  Tensor matrix(const Tensor& weight) const;                    // [V, H]
  // The merged matrix without autograd (merging and saving).
  Tensor merged(const Tensor& weight) const;

  // Installs (or removes) the override on the model; the model keeps `tokens` alive.
  static void attach(const std::shared_ptr<TrainableTokens>& tokens, DecoderModel& model);
  static void detach(DecoderModel& model);

 private:
  std::vector<int64_t> indices_;
  Tensor index_tensor_;  // i64 [n] on the model's device
  Tensor delta_;
  bool enabled_ = true;
};

}  // namespace leantune
