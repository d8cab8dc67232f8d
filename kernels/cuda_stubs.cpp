// CPU-only builds: every CUDA entry point of the kernels exists and reports that this build has
// no CUDA, so that code and tests referring to them link (GPU tests skip before calling them).
#ifndef LEANTUNE_WITH_CUDA
#include "engine/check.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/residual.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace leantune::kernels {

void attention_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                        const AttentionOptions& opt, const Tensor& out, const Tensor& lse) {
  LT_THROW_NO_CUDA("attention_fwd_cuda");
}
void attention_bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens_q,
                        const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv) {
  LT_THROW_NO_CUDA("attention_bwd_cuda");
}
void cross_entropy_fwd_cuda(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows,
                            const Tensor& lse) {
  LT_THROW_NO_CUDA("cross_entropy_fwd_cuda");
}
void cross_entropy_bwd_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, const Tensor& dlogits) {
  LT_THROW_NO_CUDA("cross_entropy_bwd_cuda");
}
void embedding_fwd_cuda(const Tensor& weight, const Tensor& ids, const Tensor& y) {
  LT_THROW_NO_CUDA("embedding_fwd_cuda");
}
void embedding_bwd_cuda(const Tensor& dy, const Tensor& ids, const Tensor& dweight) {
  LT_THROW_NO_CUDA("embedding_bwd_cuda");
}
void linear_fwd_cuda(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  LT_THROW_NO_CUDA("linear_fwd_cuda");
}
void linear_bwd_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                     const Tensor& dw, const Tensor& db) {
  LT_THROW_NO_CUDA("linear_bwd_cuda");
}
double linear_cross_entropy_fwd_bwd_cuda(const Tensor& hidden, const Tensor& weight,
                                         const Tensor& targets, double grad_scale,
                                         const Tensor& dhidden, const Tensor& dweight,
                                         const LinearCrossEntropyOptions& opt) {
  LT_THROW_NO_CUDA("linear_cross_entropy_fwd_bwd_cuda");
}
void residual_add_fwd_cuda(const Tensor& a, const Tensor& b, const Tensor& y) {
  LT_THROW_NO_CUDA("residual_add_fwd_cuda");
}
void rms_norm_fwd_cuda(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                       const Tensor& rstd) {
  LT_THROW_NO_CUDA("rms_norm_fwd_cuda");
}
void rms_norm_bwd_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       const Tensor& dx, const Tensor& dw) {
  LT_THROW_NO_CUDA("rms_norm_bwd_cuda");
}
void rope_apply_cuda(const Tensor& x, const Tensor& position_ids, const Tensor& inv_freq,
                     bool inverse, const Tensor& y) {
  LT_THROW_NO_CUDA("rope_apply_cuda");
}
void swiglu_fwd_cuda(const Tensor& gate, const Tensor& up, const Tensor& y) {
  LT_THROW_NO_CUDA("swiglu_fwd_cuda");
}
void swiglu_bwd_cuda(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup) {
  LT_THROW_NO_CUDA("swiglu_bwd_cuda");
}
}  // namespace leantune::kernels
#endif
