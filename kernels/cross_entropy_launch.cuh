// The launchers of cross_entropy.cu on raw device pointers, for other kernels' files that run them
// on buffers of their own (linear_cross_entropy.cu's row statistics). Nothing is checked here:
// the caller has validated the targets (each -100 or in [0, v)) and the shapes.
//   logits:[rows, v] contiguous (f32, bf16, f16, f64), targets:[rows] i64 on the device;
//   loss_rows, lse, entropy, top1:[rows] f32 (f64 for f64 logits). Stream last.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/dtype.h"

namespace leantune::kernels {

void cross_entropy_fwd_launch(const void* logits, const int64_t* targets, void* loss_rows,
                              void* lse, int64_t rows, int64_t v, DType dt, cudaStream_t stream);
void cross_entropy_bwd_launch(const void* logits, const int64_t* targets, const void* lse,
                              double scale, void* dlogits, int64_t rows, int64_t v, DType dt,
                              cudaStream_t stream);
void cross_entropy_row_stats_launch(const void* logits, const int64_t* targets, const void* lse,
                                    void* entropy, void* top1, int64_t rows, int64_t v, DType dt,
                                    cudaStream_t stream);

}  // namespace leantune::kernels
