// linear_cross_entropy: the LM head and the loss fused, chunked over tokens, never holding the
// full [T,V] logits.
//   hidden:[T,H], weight:[V,H] (same float dtype), targets:[T] i32|i64 (-100 ignored)
//   -> loss: [] f32 (f64 for f64) = sum over valid t of nll_t / normalizer
// For each chunk of `chunk_tokens` rows (only rows with a valid target are computed):
//   logits_c = hidden_c W^T (f32 accumulate), lse_c, loss_c;
//   when gradients are needed: G_c = (softmax - onehot) / normalizer,
//   dhidden_c = G_c W, dW += G_c^T hidden_c (f32 products; dW held in W's dtype, a 16-bit dW
//   rounded once per chunk as Liger's FLCE does).
// The gradients are computed during the forward pass (as Liger's FLCE does) and held until
// backward, which scales them by dloss. Peak extra memory: the chunk's logits and G
// (chunk_tokens x V floats, bf16/f16 logits on CUDA) plus dW in W's dtype when W requires grad;
// no f32 copy of a 16-bit W (CPU: f32 blocks of about 16 MiB); independent of T.
// Workspace is tagged kWorkspace; dhidden is tagged kActivation.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/weight_grad_sink.h"

namespace leantune::kernels {

// Sums over the valid rows of the distribution softmax(z) (TRL's SFT entropy and
// mean_token_accuracy): entropy lse - sum_j p_j z_j, and the rows whose target is the top-1
// logit (the first of equal maxima). Added to; not with softcap on CUDA.
struct LinearCrossEntropyStats {
  double entropy_sum = 0;
  int64_t top1 = 0;
};

struct LinearCrossEntropyOptions {
  int64_t chunk_tokens = 1024;
  // Set: linear_cross_entropy adds the rows' statistics to it (one more pass over each chunk's
  // logits). Not supported by linear_cross_entropy_weight_blocks.
  LinearCrossEntropyStats* stats = nullptr;
  // > 0: the logits are soft-capped, z -> softcap * tanh(z / softcap), before the softmax (Gemma's
  // final_logit_softcapping), inside each chunk: still no [T, V] tensor. Not supported by
  // linear_cross_entropy_weight_blocks.
  double softcap = 0.0;
};

Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                            double normalizer, const LinearCrossEntropyOptions& opt = {});

// The same loss with the weight's gradient handed out block by block instead of held whole
// (linear_cross_entropy_blocks.cpp), for an optimizer that updates the LM head inside the loss
// (optimizer_in_backward): the sink (kernels/weight_grad_sink.h) receives the blocks during
// forward. The whole [V, H] gradient never exists. Two passes over the vocabulary in blocks of
// `block_rows` rows (0 = weight_grad_block_rows): the first forms each row's log-sum-exp and
// target logit, the second recomputes each block's logits, forms (softmax - onehot)/normalizer,
// accumulates dhidden in f32 and the block's gradient over all tokens (f32, rounded once). One
// more head GEMM than linear_cross_entropy. Ignored rows are computed and contribute nothing.
// Differentiable with respect to hidden only; its backward expects d loss = 1 (the sink has
// already used that), and anything else is an Error.
// Scratch (kWorkspace): a [chunk_tokens x block_rows] f32 logits block, the block's f32
// gradient (and its copy in the weight's dtype, kGrad), dhidden in f32 [T, H].
Tensor linear_cross_entropy_weight_blocks(const Tensor& hidden, const Tensor& weight,
                                          const Tensor& targets, double normalizer,
                                          const WeightGradSink& sink,
                                          const LinearCrossEntropyOptions& opt = {},
                                          int64_t block_rows = 0);

// The operand checks the CPU and CUDA entry points share: hidden [T,H] and weight [V,H] (V > 0)
// of one float dtype, targets [T] i32|i64.
void linear_cross_entropy_check_operands(const char* op, const Tensor& hidden, const Tensor& weight,
                                         const Tensor& targets);

// Raw entry point: loss value (sum of nll over valid rows, not normalised), and when dhidden /
// dweight are defined, the gradients of (sum nll) * grad_scale. dweight is accumulated into.
double linear_cross_entropy_fwd_bwd(const Tensor& hidden, const Tensor& weight,
                                    const Tensor& targets, double grad_scale, const Tensor& dhidden,
                                    const Tensor& dweight, const LinearCrossEntropyOptions& opt);
double linear_cross_entropy_fwd_bwd_cuda(const Tensor& hidden, const Tensor& weight,
                                         const Tensor& targets, double grad_scale,
                                         const Tensor& dhidden, const Tensor& dweight,
                                         const LinearCrossEntropyOptions& opt);

// Per-token log-probabilities of the targets, chunked the same way (for preference and RL
// losses): logp:[T] f32 (f64 for f64), 0 where the target is -100. Differentiable w.r.t. hidden
// and weight; backward recomputes the logits chunk by chunk.
Tensor linear_token_logprobs(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                             const LinearCrossEntropyOptions& opt = {});

// Raw per-row entry point behind linear_token_logprobs (CPU only so far; a CUDA version would
// make linear_token_logprobs work on the GPU). When nll is defined ([T] f32, f64 for f64 inputs)
// it receives lse_t - z[t, y_t], 0 where ignored. When dhidden / dweight are defined, coef ([T],
// nll's dtype rules) is required and they receive the gradients of sum_t coef[t] * nll_t:
// dhidden overwritten (0 on ignored rows), dweight accumulated into.
void linear_cross_entropy_rows(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                               const Tensor& coef, const Tensor& nll, const Tensor& dhidden,
                               const Tensor& dweight, const LinearCrossEntropyOptions& opt);

}  // namespace leantune::kernels
