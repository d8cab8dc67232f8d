// embedding: y[t] = weight[ids[t]]
//   weight:[V,H] f32|bf16|f16|f64, ids:[T] i32|i64 -> y:[T,H] (weight's dtype)
// Backward: dweight[v] = sum over t with ids[t]==v of dy[t] (accumulated in f32, f64 for f64).
// An id outside [0, V) is an Error naming the id.
#pragma once

#include "engine/tensor.h"
#include "kernels/weight_grad_sink.h"

namespace leantune::kernels {

Tensor embedding(const Tensor& weight, const Tensor& ids);

// The same lookup, whose backward hands the weight's gradient to `sink` block by block
// (kernels/weight_grad_sink.h; blocks of block_rows rows, 0 = weight_grad_block_rows) instead of
// returning it: for optimizer_in_backward, so that the [V, H] gradient never exists. Each block
// is embedding_bwd over the positions whose id falls in it (gathered, in token order): on the CPU
// its rows equal the whole gradient's bit for bit. Scratch per block: the gathered dy rows and
// the block's gradient (kGrad).
Tensor embedding_weight_blocks(const Tensor& weight, const Tensor& ids, const WeightGradSink& sink,
                               int64_t block_rows = 0);

void embedding_fwd(const Tensor& weight, const Tensor& ids, const Tensor& y);
// dweight is zeroed and then accumulated.
void embedding_bwd(const Tensor& dy, const Tensor& ids, const Tensor& dweight);

void embedding_fwd_cuda(const Tensor& weight, const Tensor& ids, const Tensor& y);
void embedding_bwd_cuda(const Tensor& dy, const Tensor& ids, const Tensor& dweight);

}  // namespace leantune::kernels
