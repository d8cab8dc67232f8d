// CUDA implementations of engine/ops.h, called by its dispatch when a tensor is on a device.
// Defined in engine/ops_cuda*.cu (libleantune_cuda), reached through the backend table
// (engine/cuda_entry_points.h).
#pragma once

#include "engine/ops.h"

namespace leantune::cuda_ops {

void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& t, double value);
Tensor add(const Tensor& a, const Tensor& b, double alpha);
void add_(const Tensor& a, const Tensor& b, double alpha);
Tensor mul(const Tensor& a, const Tensor& b);
void mul_(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor affine(const Tensor& a, double alpha, double beta);
void scale_(const Tensor& a, double s);
Tensor unary(const Tensor& x, ops::Unary op);
Tensor sum(const Tensor& x);
Tensor sum_dim(const Tensor& x, int64_t dim, bool keepdim);
Tensor max_last(const Tensor& x);
Tensor argmax_last(const Tensor& x);
double sum_squares(const Tensor& x);
double max_abs(const Tensor& x);
bool all_finite(const Tensor& x);
void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta);
Tensor softmax_last(const Tensor& x, bool log);
Tensor index_rows(const Tensor& table, const Tensor& ids);

}  // namespace leantune::cuda_ops
