// libleantune_cuda's export of the kernels' CUDA entry points (kernels/cuda_entry_points.h),
// which libleantune finds with dlsym when it loads the backend.
#include "kernels/cuda_entry_points.h"

extern "C" __attribute__((visibility("default")))
const leantune::kernels::KernelsCudaTable LT_KERNELS_CUDA_TABLE = {
    {leantune::kernels::kKernelsCudaAbiVersion, sizeof(leantune::kernels::KernelsCudaTable)},
    LT_KERNELS_CUDA_ENTRY_POINTS(LT_CUDA_TABLE_ENTRY)};
