// linear: y = x W^T + b
//   x:[T,in], W:[out,in], b:[out] or undefined -> y:[T,out]; all one float dtype
// Backward: dx = dy W; dW = dy^T x; db = sum_t dy. A frozen W (requires_grad false) gets no
// dW and no dW workspace. GEMMs accumulate in f32 (f64 for f64). On CUDA through cuBLASLt with
// the bias in the epilogue; workspace comes from the caching allocator (kWorkspace).
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// y = x W^T (+ b); y preallocated [T,out].
void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
// Any of dx, dw, db may be undefined (not needed). dw/db are overwritten, not accumulated.
void linear_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                const Tensor& dw, const Tensor& db);

void linear_fwd_cuda(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
void linear_bwd_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                     const Tensor& dw, const Tensor& db);

}  // namespace leantune::kernels
