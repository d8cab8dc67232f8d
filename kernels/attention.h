// attention: causal, grouped-query, variable-length scaled dot-product attention.
//   q:[Tq,Hq,D], k:[Tk,Hk,D], v:[Tk,Hk,D] (one float dtype), Hq % Hk == 0 (GQA group Hq/Hk)
//   cu_seqlens_q:[B+1], cu_seqlens_k:[B+1] i32 (host or device, prefix sums; sequence b owns
//   rows [cu[b], cu[b+1]) of q and of k/v; lengths may differ between q and k, and may be 0)
//   -> out:[Tq,Hq,D] (q's dtype), lse:[Hq,Tq] f32, f64 for f64 inputs (log-sum-exp of the
//   scaled scores per row)
// Causal alignment is bottom-right: query i of a sequence with Lq queries and Lk keys sees keys
// j <= i + (Lk - Lq). (Training has Lq == Lk; decoding with a KV cache has Lq <= Lk.) A query row
// that sees no key gets out = 0 and lse = -inf.
// Sliding window (window > 0, Mistral/Gemma/Phi-3's sliding_window): query i sees only the last
// `window` of its causal keys, i + Lk - Lq - window < j <= i + Lk - Lq (transformers'
// sliding_window_overlay, flash-attention's window_size (window - 1, 0)); packed sequences and the
// KV-cache decode (Lq < Lk) align it the same bottom-right way.
// Soft-capping (softcap > 0, Gemma 2-style attn_logit_softcapping): scores s = scale q.k become
// softcap * tanh(s / softcap) before the softmax; backward multiplies dS by 1 - tanh^2.
// Scores and softmax in f32 (f64 for f64). Scale defaults to 1/sqrt(D).
// Backward recomputes probabilities from lse: with P = exp(S*scale - lse), dV = P^T dO,
// dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K * scale, dK = dS^T Q * scale; dK/dV of
// a KV head sum over the query heads of its group. The lse lets partial results over disjoint
// key blocks be merged exactly (ring attention).
// On CUDA two implementations keep this contract: cuDNN's fused attention (bf16/f16 training and
// prefill shapes, kernels/attention_cudnn.h) and leantune's own kernels (every case). `backend`
// chooses; under kAuto the environment variable LEANTUNE_ATTENTION (auto, own, cudnn) decides,
// and auto takes cuDNN wherever it applies and loads.
#pragma once

#include <string>

#include "engine/tensor.h"

namespace leantune::kernels {

// kAuto: cuDNN where it applies and can be loaded, else our kernels. kOwn: our kernels only.
// kCudnn: cuDNN wherever it applies; a failure to load it is an error (one line, the reason).
enum class AttentionBackend { kAuto, kOwn, kCudnn };

struct AttentionOptions {
  bool causal = true;
  double scale = 0.0;        // 0 = 1/sqrt(D)
  int64_t window = 0;        // keys a query sees, itself included (causal only); 0 = all
  double softcap = 0.0;      // 0 = off
  int64_t max_seqlen_q = 0;  // 0 = computed from cu_seqlens (a hint for the CUDA launch)
  int64_t max_seqlen_k = 0;
  // cu_seqlens[B], the rows inside sequences (q and k alike), or 0 = unknown. A hint for the CUDA
  // path as max_seqlen is: with device cu_seqlens and hints the host never reads them, and cuDNN's
  // dense graph (every row in one of B equal-length sequences) needs it to equal T. Where the host
  // reads cu_seqlens (the CPU path, host cu_seqlens), a non-zero value is checked against them.
  int64_t total_seqlen = 0;
  // CUDA only. The cuDNN path takes max_seqlen_q as the longest sequence's length (a hint below
  // it leaves the longer sequences' rows unspecified); our kernels only lose time to a too-small
  // hint.
  AttentionBackend backend = AttentionBackend::kAuto;
};

// Whether attention on CUDA device `device` can use cuDNN (and why not), and how many forward and
// backward calls cuDNN has run in this process (dense_calls of them on a dense graph: every
// sequence of the batch as long as the longest, kernels/attention_cudnn.h).
struct CudnnAttentionStatus {
  bool available = false;
  std::string why;
  int64_t calls = 0;
  int64_t dense_calls = 0;
};
CudnnAttentionStatus cudnn_attention_status(int device);
CudnnAttentionStatus cudnn_attention_status_cuda(int device);

struct AttentionOutput {
  Tensor out;
  Tensor lse;
};

// Differentiable w.r.t. q, k, v (lse carries no gradient).
AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                          const AttentionOptions& opt = {});

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                   const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& out,
                   const Tensor& lse);
// dq, dk, dv are overwritten.
void attention_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens_q,
                   const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv);

void attention_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                        const AttentionOptions& opt, const Tensor& out, const Tensor& lse);
void attention_bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens_q,
                        const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv);

}  // namespace leantune::kernels
