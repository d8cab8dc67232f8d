// The kernels' CUDA entry points, listed once (see engine/cuda_backend.h). Each is declared in
// its op header (kernels/<op>.h) and defined in kernels/<op>.cu; libleantune reaches it through
// KernelsCudaTable. Changing the list or a signature: bump the ABI version.
#pragma once

#include "engine/cuda_backend.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/divergence_blocks.h"
#include "kernels/dropout.h"
#include "kernels/embedding.h"
#include "kernels/kv_cache_write.h"
#include "kernels/linear.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/optim_8bit.h"
#include "kernels/quant.h"
#include "kernels/residual.h"
#include "kernels/ring_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "kernels/vocab_block_softmax.h"

// The exported table's name.
#define LT_KERNELS_CUDA_TABLE leantune_cuda_kernels_table

// clang-format off
#define LT_KERNELS_CUDA_ENTRY_POINTS(X)                                                           \
  X(void, leantune::kernels, attention_fwd_cuda,                                                  \
    (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,               \
     const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& out,                  \
     const Tensor& lse),                                                                          \
    (q, k, v, cu_seqlens_q, cu_seqlens_k, opt, out, lse))                                         \
  X(void, leantune::kernels, attention_bwd_cuda,                                                  \
    (const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,     \
     const Tensor& lse, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,                   \
     const AttentionOptions& opt, const Tensor& dq, const Tensor& dk, const Tensor& dv),          \
    (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, opt, dq, dk, dv))                       \
  X(kernels::CudnnAttentionStatus, leantune::kernels, cudnn_attention_status_cuda, (int device), \
    (device))                                                                                     \
  X(void, leantune::kernels, cross_entropy_fwd_cuda,                                              \
    (const Tensor& logits, const Tensor& targets, const Tensor& loss_rows, const Tensor& lse),    \
    (logits, targets, loss_rows, lse))                                                            \
  X(void, leantune::kernels, cross_entropy_bwd_cuda,                                              \
    (const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale,                \
     const Tensor& dlogits),                                                                      \
    (logits, targets, lse, scale, dlogits))                                                       \
  X(void, leantune::kernels, cross_entropy_row_stats_cuda,                                        \
    (const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& entropy,       \
     const Tensor& top1),                                                                         \
    (logits, targets, lse, entropy, top1))                                                        \
  X(void, leantune::kernels, dropout_apply_cuda,                                                  \
    (const Tensor& x, const Tensor& y, double p, const PhiloxParams& params), (x, y, p, params))  \
  X(void, leantune::kernels, embedding_fwd_cuda,                                                  \
    (const Tensor& weight, const Tensor& ids, const Tensor& y), (weight, ids, y))                 \
  X(void, leantune::kernels, embedding_bwd_cuda,                                                  \
    (const Tensor& dy, const Tensor& ids, const Tensor& dweight), (dy, ids, dweight))             \
  X(void, leantune::kernels, kv_cache_write_cuda,                                                 \
    (const Tensor& pool, const Tensor& slots, const Tensor& rows), (pool, slots, rows))           \
  X(void, leantune::kernels, linear_fwd_cuda,                                                     \
    (const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y), (x, w, b, y))           \
  X(void, leantune::kernels, linear_bwd_cuda,                                                     \
    (const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw,      \
     const Tensor& db),                                                                           \
    (dy, x, w, dx, dw, db))                                                                       \
  X(double, leantune::kernels, linear_cross_entropy_fwd_bwd_cuda,                                 \
    (const Tensor& hidden, const Tensor& weight, const Tensor& targets, double grad_scale,        \
     const Tensor& dhidden, const Tensor& dweight, const LinearCrossEntropyOptions& opt),          \
    (hidden, weight, targets, grad_scale, dhidden, dweight, opt))                                 \
  X(void, leantune::kernels, nf4_block_absmax_cuda,                                               \
    (const Tensor& qabsmax, const Tensor& absmax2, float offset, const Tensor& out),              \
    (qabsmax, absmax2, offset, out))                                                              \
  X(void, leantune::kernels, nf4_dequantize_cuda,                                                 \
    (const Tensor& packed, const Tensor& absmax, int64_t n, const Tensor& out),                   \
    (packed, absmax, n, out))                                                                     \
  X(void, leantune::kernels, int8_dequantize_cuda,                                                \
    (const Tensor& q, const Tensor& absmax, const Tensor& out), (q, absmax, out))                 \
  X(void, leantune::kernels, adamw8bit_step_cuda,                                                 \
    (const std::vector<Adam8Tensor>& tensors, const AdamWStepArgs& args), (tensors, args))        \
  X(void, leantune::kernels, residual_add_fwd_cuda,                                               \
    (const Tensor& a, const Tensor& b, const Tensor& y), (a, b, y))                               \
  X(void, leantune::kernels, ring_gather_cuda,                                                    \
    (const Tensor& src, const Tensor& rows, const Tensor& dst), (src, rows, dst))                 \
  X(void, leantune::kernels, ring_add_rows_cuda,                                                  \
    (const Tensor& dst, const Tensor& rows, const Tensor& src), (dst, rows, src))                 \
  X(void, leantune::kernels, ring_lse_merge_cuda,                                                 \
    (const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,              \
     const Tensor& rows),                                                                         \
    (out, lse, out_b, lse_b, rows))                                                               \
  X(void, leantune::kernels, rms_norm_fwd_cuda,                                                   \
    (const Tensor& x, const Tensor& w, double eps, bool unit_offset, const Tensor& y,            \
     const Tensor& rstd),                                                                         \
    (x, w, eps, unit_offset, y, rstd))                                                            \
  X(void, leantune::kernels, add_rms_norm_fwd_cuda,                                               \
    (const Tensor& a, const Tensor& b, const Tensor& w, double eps, bool unit_offset,             \
     const Tensor& sum, const Tensor& y, const Tensor& rstd),                                     \
    (a, b, w, eps, unit_offset, sum, y, rstd))                                                    \
  X(void, leantune::kernels, rms_norm_bwd_cuda,                                                   \
    (const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, bool unit_offset,    \
     const Tensor& dx, const Tensor& dw, const Tensor& dres),                                     \
    (dy, x, w, rstd, unit_offset, dx, dw, dres))                                                  \
  X(void, leantune::kernels, rope_apply_cuda,                                                     \
    (const Tensor& x, const Tensor& position_ids, const Tensor& inv_freq, bool inverse,           \
     double scale, const Tensor& y),                                                              \
    (x, position_ids, inv_freq, inverse, scale, y))                                               \
  X(void, leantune::kernels, swiglu_fwd_cuda,                                                     \
    (const Tensor& gate, const Tensor& up, const Tensor& y), (gate, up, y))                       \
  X(void, leantune::kernels, swiglu_bwd_cuda,                                                     \
    (const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,                 \
     const Tensor& dup),                                                                          \
    (dy, gate, up, dgate, dup))                                                                   \
  X(void, leantune::kernels, geglu_fwd_cuda,                                                      \
    (const Tensor& gate, const Tensor& up, const Tensor& y), (gate, up, y))                       \
  X(void, leantune::kernels, geglu_bwd_cuda,                                                      \
    (const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,                 \
     const Tensor& dup),                                                                          \
    (dy, gate, up, dgate, dup))                                                                   \
  X(void, leantune::kernels, vocab_block_lse_update_cuda,                                         \
    (const Tensor& z, const Tensor& targets, int64_t v0, const Tensor& lse, const Tensor& zy),    \
    (z, targets, v0, lse, zy))                                                                    \
  X(void, leantune::kernels, vocab_block_softmax_grad_cuda,                                       \
    (const Tensor& z, const Tensor& targets, int64_t v0, const Tensor& lse, double scale,         \
     const Tensor& dz),                                                                           \
    (z, targets, v0, lse, scale, dz))                                                             \
  X(void, leantune::kernels, divergence_block_stats_cuda,                                         \
    (const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p, const Tensor& stats),     \
    (zs, zt, p, stats))                                                                           \
  X(void, leantune::kernels, divergence_block_jsd_cuda,                                           \
    (const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p, const Tensor& stats),     \
    (zs, zt, p, stats))                                                                           \
  X(void, leantune::kernels, divergence_block_grad_cuda,                                          \
    (const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p, const Tensor& rowtab,    \
     const Tensor& dz),                                                                           \
    (zs, zt, p, rowtab, dz))
// clang-format on

namespace leantune::kernels {

inline constexpr uint32_t kKernelsCudaAbiVersion = 10;
inline constexpr const char* kKernelsCudaTableSymbol = LT_CUDA_STR(LT_KERNELS_CUDA_TABLE);

struct KernelsCudaTable {
  CudaTableHeader header;
  LT_KERNELS_CUDA_ENTRY_POINTS(LT_CUDA_TABLE_FIELD)
};

}  // namespace leantune::kernels
