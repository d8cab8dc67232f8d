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
// dw may be undefined (frozen weight); it is overwritten, not accumulated.
void rms_norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                  const Tensor& dx, const Tensor& dw, bool unit_offset = false);

void rms_norm_fwd_cuda(const Tensor& x, const Tensor& w, double eps, bool unit_offset,
                       const Tensor& y, const Tensor& rstd);
void rms_norm_bwd_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       bool unit_offset, const Tensor& dx, const Tensor& dw);

}  // namespace leantune::kernels
