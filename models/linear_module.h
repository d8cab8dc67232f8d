// A projection of the decoder (q/k/v/o, gate/up/down, lm_head): y = x W^T + b.
//   x:[T,in] -> y:[T,out]. Weight [out,in] and optional bias [out], with their Hugging Face
//   name prefix ("model.layers.3.self_attn.q_proj"). Model-level techniques attach here, so the
//   decoder code is the same for all of them:
//   - `base`: a replacement for the dense weight (a quantized NF4 / int8 weight); when set,
//     `weight` is undefined and the base product is base->forward(x, bias);
//   - `adapter`: something added to the base output (LoRA): y = adapter->forward(x, base_out);
//     the base output is handed over (moved), so an adapter may add to it in place.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace leantune {

// A frozen base weight stored in another form (quantized). forward() is differentiable with
// respect to x only.
class LinearBase {
 public:
  virtual ~LinearBase() = default;
  virtual Tensor forward(const Tensor& x, const Tensor& bias) const = 0;
  // The weight as a dense [out, in] tensor of `dtype` (merging, saving, tests).
  virtual Tensor dequantize(DType dtype) const = 0;
  // Bytes the stored form occupies (memory reports and estimates).
  virtual int64_t storage_bytes() const = 0;
  virtual std::string kind() const = 0;  // "nf4", "int8", ...
  // The tensors that hold the stored form, named after the module's weight as bitsandbytes names
  // them ("weight", "weight.absmax", ...), each the sole user of its storage: ZeRO-3 shards them
  // (dist/zero3.h). A base that lists none stays whole on every rank.
  virtual std::vector<std::pair<std::string, Tensor>> stored_tensors() const { return {}; }
};

// A trainable addition to the base output. base_out is the caller's to give: LinearModule moves
// its base product in (no backward saves that product), so the adapter may write into it when it
// holds the only reference.
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  virtual Tensor forward(const Tensor& x, Tensor base_out) const = 0;
};

struct LinearModule {
  std::string name;
  Tensor weight;  // [out, in], undefined when `base` holds the weight
  Tensor bias;    // [out] or undefined
  int64_t in_features = 0;
  int64_t out_features = 0;
  std::shared_ptr<LinearBase> base;
  std::shared_ptr<LinearAdapter> adapter;

  Tensor forward(const Tensor& x) const;
  // The dense weight whatever its storage.
  Tensor dense_weight(DType dtype) const;
};

}  // namespace leantune
