// vocab_block_softmax: the two row passes of a cross-entropy whose logits arrive one block of
// vocabulary columns at a time, for the fused loss that hands the LM head's gradient out block
// by block (linear_cross_entropy with a weight_grad_sink; see linear_cross_entropy.h).
//   z:[T,nb] f32|f64, the logits of columns [v0, v0 + nb) of a vocabulary;
//   targets:[T] i64 (-100 = ignored; else a column of the whole vocabulary, checked by the
//   caller), on z's device; lse, zy:[T] of z's dtype.
// vocab_block_lse_update: lse[t] = logaddexp(lse[t], logsumexp(z[t])) for every counted row, and
//   zy[t] = z[t, y_t - v0] when the row's target falls in the block; ignored rows untouched. Over
//   all blocks, starting from lse = -inf, lse becomes the row's log-sum-exp and zy its target
//   logit.
// vocab_block_softmax_grad: dz[t, j] = (exp(z[t, j] - lse[t]) - [v0 + j == y_t]) * scale for
//   counted rows (p - 1 formed before the scale, as cross_entropy does), 0 for ignored rows. dz
//   may alias z.
// No scratch. The CUDA versions take one block of threads per row.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace leantune::kernels {

void vocab_block_lse_update(const Tensor& z, const Tensor& targets, int64_t v0, const Tensor& lse,
                            const Tensor& zy);
void vocab_block_softmax_grad(const Tensor& z, const Tensor& targets, int64_t v0, const Tensor& lse,
                              double scale, const Tensor& dz);

void vocab_block_lse_update_cuda(const Tensor& z, const Tensor& targets, int64_t v0,
                                 const Tensor& lse, const Tensor& zy);
void vocab_block_softmax_grad_cuda(const Tensor& z, const Tensor& targets, int64_t v0,
                                   const Tensor& lse, double scale, const Tensor& dz);

}  // namespace leantune::kernels
