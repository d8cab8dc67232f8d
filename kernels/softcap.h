// softcap: y = c * tanh(x / c), differentiable (Gemma's final logit soft-capping on full
// logits; the fused losses apply the same map inside their chunks).
//   x: any float tensor -> y like x. Three steps, each rounded to x's dtype as transformers'
//   three tensor ops are: u = x / c, t = tanh(u), y = t * c.
// Backward: dx = dy * (1 - t^2), t saved (x's dtype). Device-generic (engine ops).
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

Tensor softcap(const Tensor& x, double cap);

}  // namespace leantune::kernels
