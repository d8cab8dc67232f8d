// rms_norm: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), per row.
//   x:[T,H], w:[H] (same float dtype) -> y:[T,H]; rstd:[T] f32 (f64 for f64), saved for backward
// Statistics in f32 (f64 for f64 input); as in Hugging Face, x*rstd is rounded to x's dtype
// before the multiply by w.
// Backward: with xh = x*rstd, dxh = dy*w:  dx = rstd * (dxh - xh * mean(dxh*xh)),  dw = sum_t
// dy*xh.
// unit_offset (Gemma): the weight is applied as (1 + w) in f32 and the product rounded once:
//   y = round((x * rstd) * (1 + w)); backward with w' = 1 + w and xh unrounded: dxh = dy*w',
//   dw = sum_t dy*xh.
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, bool unit_offset = false);

void rms_norm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd,
                  bool unit_offset = false);
// dw may be undefined (frozen weight); it is overwritten, not accumulated. dres (optional, like
// dy): a gradient that reaches x by another path, added to dx after dx's rounding, as autograd
// would sum the two: dx = round(round(dx) + dres). dx may share storage with dy or dres.
void rms_norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                  const Tensor& dx, const Tensor& dw, bool unit_offset = false,
                  const Tensor& dres = Tensor());

// add_rms_norm: a residual add and the RMSNorm of its sum as one op (a decoder layer's
// `h1 = h + attn_out; x = post_attention_layernorm(h1)`), so that on CUDA the sum is formed,
// written and normalised in one pass over a and b instead of being written and read back:
//   a, b:[..., H], w:[H], one float dtype -> sum = round(a + b) (residual_add's), y =
//   rms_norm(sum, w); rstd:[rows] as rms_norm's.
// Backward: dsum' = round(round(rms_norm's dx from dy) + dsum); da = db = dsum'; dw as rms_norm's.
// Every output and gradient equals residual_add followed by rms_norm bit for bit.
// b by value: when the call holds the only reference to b and its storage (the caller moved it
// in; b's producer saved nothing of it, as a linear or rms_norm saves its input, not its output)
// and b is contiguous, y is written into b's storage (each element is read before it is written),
// so the op allocates one [..., H] output, not two.
struct AddRmsNormOutput {
  Tensor sum, y;
};
AddRmsNormOutput add_rms_norm(const Tensor& a, Tensor b, const Tensor& w, double eps,
                              bool unit_offset = false);
void add_rms_norm_fwd(const Tensor& a, const Tensor& b, const Tensor& w, double eps,
                      const Tensor& sum, const Tensor& y, const Tensor& rstd,
                      bool unit_offset = false);

void rms_norm_fwd_cuda(const Tensor& x, const Tensor& w, double eps, bool unit_offset,
                       const Tensor& y, const Tensor& rstd);
void add_rms_norm_fwd_cuda(const Tensor& a, const Tensor& b, const Tensor& w, double eps,
                           bool unit_offset, const Tensor& sum, const Tensor& y,
                           const Tensor& rstd);
void rms_norm_bwd_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       bool unit_offset, const Tensor& dx, const Tensor& dw, const Tensor& dres);

}  // namespace leantune::kernels
