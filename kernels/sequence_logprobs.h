// sequence_logprobs: per-sequence sums of target log-probabilities over a flat varlen batch,
// differentiable, for preference and RL losses (DPO, KTO, GRPO) that need one log-probability
// per sequence rather than a token-mean loss.
//   targets:[T] i32|i64 host (already shifted, kIgnoreIndex = not counted),
//   cu_seqlens:[B+1] i32|i64 host -> logps:[B] f32 (f64 for f64 inputs) on the input's device,
//   logps[b] = sum over counted t in sequence b of log softmax(z_t)[targets[t]].
// Two forms of the logits z:
//   linear_sequence_logprobs: z = hidden W^T computed chunk by chunk (hidden:[T,H], weight:[V,H],
//     one float dtype). Only rows with a target are computed, in "runs" (maximal stretches of
//     consecutive counted rows of one sequence) cut into chunks of at most chunk_tokens rows.
//     The [T, V] logits never exist: forward holds one chunk's logits [c, V] (work dtype) and
//     its lse; backward recomputes each chunk, forms dZ = -g_b (softmax - onehot) in one [c, V]
//     buffer, dX_c = dZ W written into dhidden's rows, dW += dZ^T X_c. Peak extra memory
//     ~ 2 chunk_tokens x V values of the work dtype (+ an f32 W copy and dW for 16-bit weights),
//     independent of T.
//   logits_sequence_logprobs: z given as full [T, V] logits (the plain path, for comparison).
// Both are built from ops::gemm and kernels::cross_entropy_{fwd,bwd}, so they run on the CPU and
// on CUDA alike. The gradient of a sequence's sum is the same for all its rows, which is what
// lets backward use cross_entropy_bwd's scalar scale once per run.
// logit_scale s: the log-probabilities of softmax(s z) rather than softmax(z) (GRPO divides the
// logits by the sampling temperature, s = 1 / temperature); backward carries the factor s.
// Optional outputs (no gradient): counted tokens per sequence and, with logit_sums, the sum
// over counted rows of the row's vocabulary-mean logit (TRL's logits/chosen metric numerator);
// with row_stats, entropy sums and top-1 counts.
// Workspace is tagged kWorkspace; dhidden kActivation; dweight kGrad.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace leantune::kernels {

struct SequenceLogprobsOptions {
  int64_t chunk_tokens = 1024;
  bool logit_sums = false;
  bool row_stats = false;  // entropy_sums and top1_counts (cross_entropy_row_stats)
  double logit_scale = 1.0;
};

struct SequenceLogprobs {
  Tensor logps;                    // [B], differentiable
  std::vector<int64_t> tokens;     // counted rows per sequence
  std::vector<double> logit_sums;  // per sequence, when asked for
  // Per sequence, when row_stats is asked for: the sum over counted rows of the row's entropy,
  // and how many of them have their target as the top-1 logit (TRL's entropy and
  // mean_token_accuracy metrics).
  std::vector<double> entropy_sums;
  std::vector<int64_t> top1_counts;
};

SequenceLogprobs linear_sequence_logprobs(const Tensor& hidden, const Tensor& weight,
                                          const Tensor& targets, const Tensor& cu_seqlens,
                                          const SequenceLogprobsOptions& opt = {});

SequenceLogprobs logits_sequence_logprobs(const Tensor& logits, const Tensor& targets,
                                          const Tensor& cu_seqlens,
                                          const SequenceLogprobsOptions& opt = {});

}  // namespace leantune::kernels
