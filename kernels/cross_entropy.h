// cross_entropy over already-aligned targets:
//   logits:[T,V] float, targets:[T] i32|i64 (-100 = ignored) -> loss: [] f32 (f64 for f64)
//   loss = sum over valid t of (logsumexp(logits[t]) - logits[t, targets[t]]) / normalizer
// `normalizer` is given by the caller (the number of valid targets in the whole accumulated
// batch), so that micro-batches sum to the mean over the accumulated batch. Softmax in f32.
// A target outside [0, V) that is not -100 is an Error.
// Backward: dlogits[t] = (softmax(logits[t]) - onehot(target)) * dloss / normalizer; zero rows
// for ignored targets. Saves the logits and the per-row logsumexp [T] f32.
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

constexpr int64_t kIgnoreIndex = -100;

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double normalizer);

// loss_rows:[T] f32 per-row loss (0 for ignored), lse:[T] f32 (both f64 for f64 logits).
void cross_entropy_fwd(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows,
                       const Tensor& lse);
// dlogits = (softmax - onehot) * scale on valid rows, 0 elsewhere.
void cross_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale,
                       const Tensor& dlogits);

void cross_entropy_fwd_cuda(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows,
                            const Tensor& lse);
void cross_entropy_bwd_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, const Tensor& dlogits);

// Shifted targets for causal LM over a flat varlen batch: targets[t] = labels[t+1] inside a
// sequence, -100 at the last position of each sequence. cu_seqlens:[B+1] i32. Host tensors.
Tensor shift_labels(const Tensor& labels, const Tensor& cu_seqlens);

}  // namespace leantune::kernels
