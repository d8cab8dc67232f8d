// divergence_blocks: the row passes of linear_divergence (kernels/linear_divergence.h) over one
// block of vocabulary columns of both models' logits, so the driver can run the same source on
// the CPU and on CUDA (as vocab_block_softmax does for the fused cross-entropy).
//   zs, zt:[c,nb] f32|f64 (one dtype), the raw logits of columns [v0, v0 + nb) of the student and
//   the teacher for c rows. Each value y becomes z = cap(y) / T with cap(y) = s tanh(y / s) when
//   the model's softcap s > 0, else y; T the temperature.
// divergence_block_stats: folds the block into each row's running statistics
//   stats:[c,kDivStats] (f64 on the CPU; zs's dtype on CUDA), columns DivStat: per model the
//   running max m and, relative to it, s_sum = sum e^(zs-m), s_zsum = sum e^(zs-m) zs,
//   s_gap = sum e^(zs-m) (zs - zt), t_sum, t_gap = sum e^(zt-m_t) (zt - zs). Start from
//   m = -inf and sums 0; after every block log Z = m + log(sum).
// divergence_block_jsd: with the final log Z of both (from the same stats), adds the block's
//   terms of the generalized JSD, beta KL(p_t || m) + (1 - beta) KL(p_s || m) with
//   m = (1 - beta) p_s + beta p_t, to column kJsd and of KL(p_s || m) to column kKlS
//   (0 < beta < 1).
// divergence_block_grad: dz[i, j] = d divergence_i / d y_s[i, j], from rowtab:[c,4] (stats'
//   dtype) = (log Z_s, log Z_t, aux, scale): g = p_s - p_t (beta 0), p_s (log p_s - log p_t -
//   aux) (beta 1), (1 - beta) p_s (log p_s - log m - aux) (else), aux the row's KL that the
//   derivative subtracts; times scale (d loss / d divergence_i / T) and the softcap's
//   derivative 1 - tanh^2. dz:[c,nb] zs's dtype (may alias zs) or, on CUDA, bf16 (rounded once,
//   as linear_cross_entropy's gradient block is).
// No scratch. CPU math in double; CUDA in the stats' dtype, one block of threads per row.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace leantune::kernels {

enum DivStat : int64_t { kSMax, kSSum, kSZSum, kSGap, kTMax, kTSum, kTGap, kJsd, kKlS, kDivStats };

struct DivergenceBlockParams {
  double inv_t = 1.0;  // 1 / temperature
  double student_softcap = 0.0;
  double teacher_softcap = 0.0;
  double beta = 0.5;
};

void divergence_block_stats(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                            const Tensor& stats);
void divergence_block_jsd(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                          const Tensor& stats);
void divergence_block_grad(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                           const Tensor& rowtab, const Tensor& dz);

void divergence_block_stats_cuda(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                                 const Tensor& stats);
void divergence_block_jsd_cuda(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                               const Tensor& stats);
void divergence_block_grad_cuda(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                                const Tensor& rowtab, const Tensor& dz);

}  // namespace leantune::kernels
