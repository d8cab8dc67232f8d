// linear_divergence: the per-token divergence between a student's and a teacher's next-token
// distributions, computed from both models' hidden states and LM heads in tiles, so neither
// model's [N, V] logits exist whole (TRL 1.16's ChunkedDivergenceFunction; Liger's fused linear
// JSD). The loss of trainer_bin distill (GKD, Agarwal et al. 2024).
//   student_hidden:[N,Hs], student_weight:[V,Hs] (one float dtype); teacher_hidden:[N,Ht],
//   teacher_weight:[V,Ht] (one float dtype, may differ from the student's: only V must match);
//   mask:[N] i32|i64 (nonzero: the row counts)
//   -> divergence:[N] f32 (f64 for f64 students), 0 on masked rows; differentiable with respect
//      to the student's hidden states and head only (the teacher is frozen)
//   -> entropy:[N] of the student's distribution, in nats, 0 on masked rows (no gradient)
// With z the logits after softcap (c tanh(z / c), when set) divided by the temperature, p_s and
// p_t their softmaxes:
//   beta == 0   forward KL(p_t || p_s) = sum p_t (log p_t - log p_s)
//   beta == 1   reverse KL(p_s || p_t)
//   otherwise   beta KL(p_t || m) + (1 - beta) KL(p_s || m), m = (1 - beta) p_s + beta p_t
// Forward: per chunk of chunk_tokens valid rows (gathered), the vocabulary in blocks of
// chunk_vocab rows of both heads: one pass folds online log-sum-exp statistics (and, for the
// KLs, the p-weighted logit gaps), the generalized JSD a second pass over the blocks
// (kernels/divergence_blocks.h). Backward recomputes the blocks: d/dz_s is p_s - p_t (forward
// KL), p_s (log p_s - log p_t - KL) (reverse KL) or (1 - beta) p_s (log p_s - log m -
// KL(p_s || m)) (JSD), times d divergence / T, times the softcap's derivative; dhidden = G W_s,
// dW_s += G^T hidden (f32 accumulation, f64 for f64). The CPU and CUDA run this same source; on
// CUDA a bf16 student's G block is bf16 (as linear_cross_entropy's), the statistics f32.
// Scratch (kWorkspace): two [chunk_tokens x chunk_vocab] blocks of logits in f32 (f64 for f64),
// on CUDA a bf16 G block, the chunk's gathered hidden rows, [R, 9] row statistics, and in
// backward the valid rows' dhidden [R, Hs] in f32 (R = valid rows); saved for backward: the
// inputs (references), the valid rows' ids and three numbers per valid row (host). One
// synchronisation in forward (the statistics are read back) and one in backward (the gradient).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace leantune::kernels {

struct LinearDivergenceOptions {
  double beta = 0.5;             // in [0, 1]
  double temperature = 1.0;      // > 0
  double student_softcap = 0.0;  // > 0: final_logit_softcapping of the student
  double teacher_softcap = 0.0;
  int64_t chunk_tokens = 1024;
  int64_t chunk_vocab = 32768;
};

struct LinearDivergence {
  Tensor divergence;  // [N]
  Tensor entropy;     // [N]
};

LinearDivergence linear_divergence(const Tensor& student_hidden, const Tensor& student_weight,
                                   const Tensor& teacher_hidden, const Tensor& teacher_weight,
                                   const Tensor& mask, const LinearDivergenceOptions& opt = {});

}  // namespace leantune::kernels
