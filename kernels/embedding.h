// embedding: y[t] = weight[ids[t]]
//   weight:[V,H] f32|bf16|f16|f64, ids:[T] i32|i64 -> y:[T,H] (weight's dtype)
// Backward: dweight[v] = sum over t with ids[t]==v of dy[t] (accumulated in f32, f64 for f64).
// An id outside [0, V) is an Error naming the id.
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

Tensor embedding(const Tensor& weight, const Tensor& ids);

void embedding_fwd(const Tensor& weight, const Tensor& ids, const Tensor& y);
// dweight is zeroed and then accumulated.
void embedding_bwd(const Tensor& dy, const Tensor& ids, const Tensor& dweight);

void embedding_fwd_cuda(const Tensor& weight, const Tensor& ids, const Tensor& y);
void embedding_bwd_cuda(const Tensor& dy, const Tensor& ids, const Tensor& dweight);

}  // namespace leantune::kernels
