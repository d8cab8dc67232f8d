// The logit gradient of the fused linear cross-entropy as the CUDA path stores it between its
// GEMMs (kernels/linear_cross_entropy.cu), in one place so that a CPU test can replay the
// 16-bit storage exactly (tests/kernels/test_linear_cross_entropy.cpp).
//   G[r, j] = softmax(z_r)_j - [j == y_r], in [-1, 1], formed in the work dtype A (f32/f64) and
//   rounded once to the logits dtype (bf16/f16 for 16-bit models). It is stored UNSCALED: the
//   loss's grad_scale (1/N tokens, often 2^-14 or smaller) is the alpha of the dX and dW GEMMs,
//   applied in f32 after the products. Scaling before the rounding would push p * grad_scale
//   under f16's smallest subnormal (5.96e-8) for every p below about 3e-4 at grad_scale = 2^-14,
//   which with a 150k vocabulary is nearly all of the non-target probability mass.
#pragma once

#include "engine/dtype.h"

namespace leantune::kernels {

// G entry for a probability p of the class that is (or is not) the row's target.
template <typename A>
LT_HD A linear_ce_grad_entry(A p, bool is_target) {
  return is_target ? p - A(1) : p;
}

// The alpha of the dX = G W and dW += G^T X GEMMs that consume the stored G.
LT_HD double linear_ce_gemm_alpha(double grad_scale) { return grad_scale; }

}  // namespace leantune::kernels
