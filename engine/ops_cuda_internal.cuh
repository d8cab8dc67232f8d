// Shared internals of the CUDA raw ops (engine/ops_cuda.h), whose definitions are split by kind:
// ops_cuda_copy.cu (copy, fill), ops_cuda_elementwise.cu, ops_cuda_reduce.cu, ops_cuda_softmax.cu,
// ops_cuda_gather.cu (index_rows and the row gather that kernels/embedding.cu shares) and
// ops_cuda_blas.cu (cuBLASLt/cuBLAS, column_sum, gemm).
//
// Contract (same as the CPU reference in engine/ops.cpp):
//   copy       dst = src with dtype conversion (through double, as the host does, except that
//              same-dtype copies move raw bytes) between any numeric dtypes; either side may be
//              strided; host<->device and device<->device (also across devices). Device->host
//              copies synchronise the stream before returning; host->device copies from pageable
//              memory return once the source was staged; from pinned memory they are
//              asynchronous and the pinned block is kept from reuse until the copy is done.
//   fill       any numeric dtype, strided or not.
//   add/mul/div/affine/scale_/unary   float dtypes, computed in f32 (f64 for f64) with each
//              product and sum rounded separately (no FMA), so results match the host's bit for
//              bit where the math library is not involved; b is converted to a's dtype first;
//              broadcast: equal shapes, a one-element b, or b equal to a's trailing dims.
//   sum / sum_dim  accumulate in double (f64 partials, fixed order: deterministic);
//              max_last ignores NaN (as std::max does); argmax_last returns the first maximum
//              (0 when element 0 is NaN), both as the sequential host loop.
//   sum_squares / max_abs / all_finite  host scalars: synchronise the stream.
//   gemm       cuBLASLt (f32 strict, bf16/f16 with f32 accumulation), f64 via cublasDgemm;
//              transposed views are taken as they are, other strided inputs are copied.
//   softmax_last / log_softmax  one block per row, f32 math (f64 for f64).
//   index_rows gather of table rows by i32/i64 ids (ids on the host or on the device); an id
//              out of range is an Error naming it (reading the flag synchronises).
// Everything runs on current_stream(device) with that device made current.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/cuda_blas.cuh"
#include "engine/cuda_utils.cuh"
#include "engine/ops_cuda.h"
#include "engine/ops_shapes.h"

namespace leantune::cuda_ops {
namespace detail {

using cu::acc_of;
using cu::add_rn;
using cu::mul_rn;

constexpr int kThreads = 256;

// Raw element words moved by the byte-copying kernels: the unsigned word of kBytes bytes.
template <int kBytes>
struct RawOf {
  static_assert(kBytes == 1 || kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16);
  using type = std::conditional_t<
      kBytes == 1, uint8_t,
      std::conditional_t<kBytes == 2, uint16_t,
                         std::conditional_t<kBytes == 4, uint32_t,
                                            std::conditional_t<kBytes == 8, uint64_t, uint4>>>>;
};

inline unsigned blocks_for(int64_t n, Device d) { return cu::grid_blocks(n, kThreads, d.index); }

using ops::check_same_device;

// dst = src on one device (ops_cuda_copy.cu).
void same_device_copy(const Tensor& dst, const Tensor& src);
// t itself when contiguous, else a contiguous copy on its device tagged `tag`.
Tensor contiguous_on_device(const Tensor& t, MemTag tag = MemTag::kWorkspace);

}  // namespace detail
using namespace detail;
}  // namespace leantune::cuda_ops
