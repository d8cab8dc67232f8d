// The dtype of the per-row statistics the kernels save for backward (log-sum-exp, rstd, entropy):
// f64 for f64 inputs, f32 for every other float dtype (f32, bf16, f16 accumulate in f32). Shared
// by the CPU and CUDA entry points, so both check and allocate the same statistics.
#pragma once

#include "engine/dtype.h"

namespace leantune::kernels {

inline DType stat_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

}  // namespace leantune::kernels
