// Test-only differentiable elementwise, reduction and matmul ops (namespace fn): tests compose
// them into small graphs to exercise the autograd engine (hooks, checkpointing, offloading) and
// to write loss formulas as references for the fused kernels. The product does not use them:
// its differentiable ops are the coarse fused nodes in kernels/ (docs/architecture.md, decision 2).
// Broadcasting follows engine/ops.h (equal shapes, a one-element b, or a trailing-shape b).
#pragma once

#include "engine/autograd.h"
#include "engine/ops.h"

namespace leantune::fn {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& a);
Tensor scale(const Tensor& a, double s);
Tensor add_scalar(const Tensor& a, double s);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor log_sigmoid(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor square(const Tensor& a);
Tensor clamp(const Tensor& a, double lo, double hi);  // gradient 0 where clamped
Tensor minimum(const Tensor& a, const Tensor& b);     // same shapes; ties send grad to a
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor sum(const Tensor& a);  // -> one element
Tensor mean(const Tensor& a);
Tensor sum_dim(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor softmax_last(const Tensor& a);
Tensor log_softmax_last(const Tensor& a);
// Concatenation along dim 0.
Tensor cat0(const std::vector<Tensor>& parts);

// Sums g down to `shape` (the inverse of broadcasting).
Tensor reduce_to(const Tensor& g, const Shape& shape);

}  // namespace leantune::fn
