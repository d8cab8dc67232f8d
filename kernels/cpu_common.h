// What the CPU kernels (kernels/*.cpp) share: engine/cpu_kernels.h's accumulation type acc_t<T>
// (f32 for f32/bf16/f16, f64 for f64), its load/store through that type and its OpenMP
// parallel_for, named in leantune::kernels; and the dtype of saved per-row statistics.
#pragma once

#include "engine/cpu_kernels.h"
#include "kernels/stat_dtype.h"

namespace leantune::kernels {

using cpu::acc_t;
using cpu::load;
using cpu::parallel_for;
using cpu::store;

}  // namespace leantune::kernels
