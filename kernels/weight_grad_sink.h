// The hand-off of a weight's gradient in blocks of rows, for ops whose weight is updated by the
// optimizer block by block (optimizer_in_backward) so that the whole [V, H] gradient never
// exists: the fused LM head + loss (linear_cross_entropy_weight_blocks) and the token embedding
// (embedding_weight_blocks).
//   sink(row0, grad): grad = d loss / d weight[row0 : row0 + n], shaped [n, H] in the weight's
//   dtype; valid only during the call. Every row of the weight is handed out exactly once, in
//   order, zero rows included (an optimizer still decays their moments).
#pragma once

#include <cstdint>
#include <functional>

#include "engine/tensor.h"

namespace leantune::kernels {

using WeightGradSink = std::function<void(int64_t row0, const Tensor& grad_rows)>;

// Rows per block for a weight of row length h: about 8 Mi elements (32 MiB of f32), a multiple
// of 256 elements so that blockwise 8-bit optimizer states split cleanly.
int64_t weight_grad_block_rows(int64_t h);

}  // namespace leantune::kernels
