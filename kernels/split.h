// split_columns: the column blocks of a fused projection as views, differentiable.
//   x:[T, C] contiguous, parts: trailing shapes whose element counts sum to C
//   -> out[i]: [T, parts[i]...], a view of x's columns [c_i, c_i + numel(parts[i])) (row stride C,
//   dense within a row; no copy).
// Phi-3's qkv_proj [q; k; v] and gate_up_proj [gate; up] are split this way, as transformers
// slices them. Backward assembles one [T, C] gradient from the parts' gradients (zeros where a
// part has none): one buffer, instead of a zero-filled [T, C] per part as narrow's backward
// would make. Device-generic (ops::copy).
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace leantune::kernels {

std::vector<Tensor> split_columns(const Tensor& x, const std::vector<Shape>& parts);

}  // namespace leantune::kernels
