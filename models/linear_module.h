// A projection of the decoder (q/k/v/o, gate/up/down, lm_head): y = x W^T + b.
//   x:[T,in] -> y:[T,out]. Weight [out,in] and optional bias [out], with their Hugging Face
//   name prefix ("model.layers.3.self_attn.q_proj"). Model-level techniques (LoRA adapters,
//   quantized base weights) attach here, so the decoder code stays the same for all of them.
#pragma once

#include <memory>
#include <string>

#include "engine/tensor.h"

namespace leantune {

struct LinearModule {
  std::string name;
  Tensor weight;  // [out, in]
  Tensor bias;    // [out] or undefined
  int64_t in_features = 0;
  int64_t out_features = 0;

  Tensor forward(const Tensor& x) const;
};

}  // namespace leantune
