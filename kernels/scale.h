// scale: y = x * s for a scalar s, differentiable; math in f32 (f64 for f64), one rounding to
// x's dtype per element, as torch multiplies two tensors of x's dtype (the caller passes s
// already rounded to that dtype when it must be, as Gemma's embedding scale is).
// Backward: dx = dy * s. Device-generic (ops::scale); nothing saved.
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

Tensor scale(const Tensor& x, double s);

// v rounded to `dtype` (bf16/f16 round to nearest even; f32 rounds once; f64 keeps it).
double round_to_dtype(double v, DType dtype);

}  // namespace leantune::kernels
