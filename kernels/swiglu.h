// swiglu: y = silu(gate) * up, silu(g) = g * sigmoid(g)
//   gate:[T,I], up:[T,I] -> y:[T,I]; math in f32 (f64 for f64)
// Backward: dgate = dy * up * sig * (1 + g * (1 - sig)), dup = dy * silu(g). Saves gate and up
// (not y).
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

Tensor swiglu(const Tensor& gate, const Tensor& up);

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& y);
void swiglu_bwd(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                const Tensor& dup);

void swiglu_fwd_cuda(const Tensor& gate, const Tensor& up, const Tensor& y);
void swiglu_bwd_cuda(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup);

}  // namespace leantune::kernels
