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
// dlogits = (softmax - onehot) * scale on valid rows, 0 elsewhere. dlogits may be logits itself
// (in place: the logits' memory reused for their gradient); any other overlap is not allowed.
void cross_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale,
                       const Tensor& dlogits);

// Per-row statistics of the distribution softmax(logits) for the metrics TRL logs (DPO's
// `entropy` and `mean_token_accuracy`), given each row's lse from cross_entropy_fwd:
//   entropy[t] = lse[t] - sum_j softmax(z_t)_j z_tj   (f32; f64 for f64 logits)
//   top1[t]    = 1 when argmax_j z_tj (the first of equal maxima, as torch.argmax) is the row's
//                target, else 0 (also for ignored rows); f32 (f64 for f64 logits).
// Reads each row once; no scratch.
void cross_entropy_row_stats(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& entropy, const Tensor& top1);
void cross_entropy_row_stats_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  const Tensor& entropy, const Tensor& top1);

void cross_entropy_fwd_cuda(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows,
                            const Tensor& lse);
void cross_entropy_bwd_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, const Tensor& dlogits);

// Shifted targets for causal LM over a flat varlen batch: targets[t] = labels[t+1] inside a
// sequence, -100 at the last position of each sequence. cu_seqlens:[B+1] i32. Host tensors.
Tensor shift_labels(const Tensor& labels, const Tensor& cu_seqlens);

}  // namespace leantune::kernels
