// libleantune_cuda's export of the engine's CUDA entry points (engine/cuda_entry_points.h),
// which libleantune finds with dlsym when it loads the backend.
#include "engine/cuda_entry_points.h"

extern "C" __attribute__((visibility("default")))
const leantune::EngineCudaTable LT_ENGINE_CUDA_TABLE = {
    {leantune::kEngineCudaAbiVersion, sizeof(leantune::EngineCudaTable)},
    LT_ENGINE_CUDA_ENTRY_POINTS(LT_CUDA_TABLE_ENTRY)};
