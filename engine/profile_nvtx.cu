// The NVTX side of the step profile (engine/profile.h): ranges named after the op kinds, so that
// Nsight Systems shows the same names as the profile's table. NVTX v3 is header-only (it finds
// the tool's injection library at run time), so only this CUDA-built file includes it.
#include <nvtx3/nvToolsExt.h>

#include "engine/cuda_api.h"

namespace leantune {

void nvtx_range_push(const char* name) { nvtxRangePushA(name); }
void nvtx_range_pop() { nvtxRangePop(); }

}  // namespace leantune
