// residual_add: y = a + b, same shape and dtype. Backward passes dy to both (no saved tensors).
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

Tensor residual_add(const Tensor& a, const Tensor& b);

void residual_add_fwd(const Tensor& a, const Tensor& b, const Tensor& y);
void residual_add_fwd_cuda(const Tensor& a, const Tensor& b, const Tensor& y);

}  // namespace leantune::kernels
