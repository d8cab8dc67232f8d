// The "naive" yardsticks of flash-attention's rule (max|ours - ref64| <= 2 max|naive - ref64| +
// floor): each op computed in its input dtype as PyTorch's eager ops run it for 16-bit inputs,
// with r() the rounding to that dtype and every sum in double.
//
// Attention (flash-attention's attention_ref without upcast), for the varlen attention and the
// ring attention rows of the table:
//   qs = r(q * scale); S = r(qs K^T), masked (causal, sliding window); A = r(softmax(S)) (0 for
//   rows that see nothing); O = r(A V). Backward: dA = r(dO V^T); dS = r(A (dA - rowsum(dA A)));
//   dq = r(r(dS K) scale); dK_h = r(dS^T qs), dV_h = r(A^T dO); dK, dV = r(sum over the GQA group
//   of dK_h, dV_h).
//
// The fused LM-head loss (linear_cross_entropy), for its 16-bit rows: logits Z = r(X W^T);
// G = r((softmax(Z) - onehot) * scale) on valid rows (0 on ignored ones); dX = r(G W);
// dW = r(G^T X).
//
// The chunked distillation loss (linear_divergence), for its 16-bit rows: Z = r(X W^T) per model,
// log p = r(log_softmax(r(Z / T))); the divergence and G = r(d divergence / dZ_s * coef) from
// those in double; dX = r(G W_s).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace leantune::backend_test {

struct NaiveAttention {
  std::vector<double> out, dq, dk, dv;  // [T, H, D] row-major, like the tensors
};

// q, dout: [Tq, Hq, D]; k, v: [Tk, Hk, D] (host, dtype dt); cq/ck the cu_seqlens; causal masks
// bottom-right aligned (row i of a sequence sees keys j <= i + Lk - Lq), and a sliding window
// (window > 0, causal only) keeps the last `window` of them. Rows outside every sequence stay 0.
NaiveAttention naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& dout, const std::vector<int64_t>& cq,
                               const std::vector<int64_t>& ck, bool causal, DType dt,
                               int64_t window = 0);

// x rounded to dt (through f32 for 16-bit dtypes), as a tensor of that dtype holds it.
double round_to(double x, DType dt);

struct NaiveLinearCrossEntropy {
  std::vector<double> dhidden, dweight;  // [T, H], [V, H]
};
// hidden:[T, H], weight:[V, H] (host, dtype dt); targets: -100 ignored.
NaiveLinearCrossEntropy naive_linear_cross_entropy(const Tensor& hidden, const Tensor& weight,
                                                   const std::vector<int64_t>& targets,
                                                   double scale, DType dt);

struct NaiveLinearDivergence {
  std::vector<double> dhidden;  // [N, Hs]
};
// Student xs:[N, Hs], ws:[V, Hs]; teacher xt:[N, Ht], wt:[V, Ht] (host, dtype dt); rows with
// mask 0 are left out; coef: d loss / d divergence per row. No soft-capping.
NaiveLinearDivergence naive_linear_divergence(const Tensor& xs, const Tensor& ws, const Tensor& xt,
                                              const Tensor& wt, const std::vector<int64_t>& mask,
                                              double beta, double temperature,
                                              const std::vector<double>& coef, DType dt);

}  // namespace leantune::backend_test
