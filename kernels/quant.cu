// Dequantization of NF4 and int8 weights on CUDA (formats and rounding: kernels/quant.h).
//   nf4_block_absmax_cuda  absmax[b] = f32(f32(kDynamicMap[qabsmax[b]] * absmax2[b / 256]) +
//   offset) nf4_dequantize_cuda    out[i] = round_to_T(f32(kNf4Code[nibble i] * absmax[i / 64]))
//   int8_dequantize_cuda   out[r, c] = round_to_T(f32(q[r, c] * f32(absmax[r] * inv127)))
// Every product and sum is an explicit IEEE f32 operation (__fmul_rn / __fadd_rn: never fused
// into an FMA), so the results equal the host path bit for bit. The code tables travel as
// kernel parameters (tables are host constants) and are copied to shared memory, where the
// nibble lookups hit distinct banks.
// Work split: each thread handles a chunk of 16 elements (8 packed bytes, or 16 int8 bytes) in a
// grid-stride loop; a chunk of 16 NF4 elements lies inside one 64-block, so it needs one absmax.
// Full chunks use one 8/16-byte load and 16-byte stores when the pointers allow it; the last
// partial chunk (and misaligned views) go element by element.
#include <cstring>

#include "engine/cuda_utils.cuh"
#include "kernels/quant.h"

namespace leantune::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 16;

struct Nf4Table {
  float v[16];
};
struct DynamicTable {
  float v[256];
};

__global__ void nested_absmax_kernel(const uint8_t* __restrict__ q,
                                     const float* __restrict__ absmax2, float offset,
                                     int64_t blocks, float* __restrict__ out, DynamicTable table) {
  __shared__ float code[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) code[i] = table.v[i];
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += stride)
    out[b] = __fadd_rn(__fmul_rn(code[q[b]], absmax2[b / kNestedBlockSize]), offset);
}

template <typename T>
__device__ __forceinline__ void store16(T* p, const float (&v)[kChunk]) {
  constexpr int W = cu::VecWidth<T>::value;
#pragma unroll
  for (int j = 0; j < kChunk; j += W) {
    float part[W];
#pragma unroll
    for (int k = 0; k < W; ++k) part[k] = v[j + k];
    cu::store_vec<T, W>(p + j, part);
  }
}

template <typename T>
__global__ void nf4_dequant_kernel(const uint8_t* __restrict__ packed,
                                   const float* __restrict__ absmax, int64_t n, T* __restrict__ out,
                                   Nf4Table table, bool vec_ok) {
  __shared__ float code[16];
  if (threadIdx.x < 16) code[threadIdx.x] = table.v[threadIdx.x];
  __syncthreads();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += stride) {
    const int64_t e0 = c * kChunk;
    const float a = absmax[e0 / kNf4BlockSize];
    if (vec_ok && e0 + kChunk <= n) {
      // Bytes 8c .. 8c+7; byte k sits in bits 8*(k%4) of word k/4 (little endian).
      const uint2 raw = *reinterpret_cast<const uint2*>(packed + e0 / 2);
      const uint32_t words[2] = {raw.x, raw.y};
      float v[kChunk];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t byte = (words[k >> 2] >> (8 * (k & 3))) & 0xFFu;
        v[2 * k] = __fmul_rn(code[byte >> 4], a);
        v[2 * k + 1] = __fmul_rn(code[byte & 0xFu], a);
      }
      store16(out + e0, v);
    } else {
      const int64_t end = e0 + kChunk < n ? e0 + kChunk : n;
      for (int64_t i = e0; i < end; ++i) {
        const uint32_t byte = packed[i >> 1];
        const uint32_t q = (i & 1) ? (byte & 0xFu) : (byte >> 4);
        out[i] = cu::from_acc<T>(__fmul_rn(code[q], a));
      }
    }
  }
}

template <typename T>
__global__ void int8_dequant_kernel(const int8_t* __restrict__ q, const float* __restrict__ absmax,
                                    int64_t rows, int64_t cols, float inv127, T* __restrict__ out,
                                    bool vec_ok) {
  const int64_t n = rows * cols;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += stride) {
    const int64_t e0 = c * kChunk;
    int64_t r = e0 / cols, col = e0 - r * cols;
    float s = __fmul_rn(absmax[r], inv127);
    if (vec_ok && e0 + kChunk <= n) {
      const int4 raw = *reinterpret_cast<const int4*>(q + e0);
      const uint32_t words[4] = {static_cast<uint32_t>(raw.x), static_cast<uint32_t>(raw.y),
                                 static_cast<uint32_t>(raw.z), static_cast<uint32_t>(raw.w)};
      float v[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        // A row boundary inside the chunk: the next row's scale (only read when the row exists).
        if (col == cols) {
          col = 0;
          ++r;
          s = __fmul_rn(absmax[r], inv127);
        }
        const int8_t qv =
            static_cast<int8_t>(static_cast<uint8_t>((words[k >> 2] >> (8 * (k & 3))) & 0xFFu));
        v[k] = __fmul_rn(static_cast<float>(qv), s);
        ++col;
      }
      store16(out + e0, v);
    } else {
      const int64_t end = e0 + kChunk < n ? e0 + kChunk : n;
      for (int64_t i = e0; i < end; ++i) {
        if (col == cols) {
          col = 0;
          ++r;
          s = __fmul_rn(absmax[r], inv127);
        }
        out[i] = cu::from_acc<T>(__fmul_rn(static_cast<float>(q[i]), s));
        ++col;
      }
    }
  }
}

bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

// An operand on device d with dtype dt.
void check_typed(const Tensor& t, DType dt, Device d, const char* op, const char* name) {
  cu::check_operand(t, d, op, name);
  cu::check_dtype(t, dt, op, name);
}

}  // namespace

void nf4_block_absmax_cuda(const Tensor& qabsmax, const Tensor& absmax2, float offset,
                           const Tensor& out) {
  const char* op = "nf4_block_absmax_cuda";
  const Device d = out.device();
  check_typed(out, DType::kF32, d, op, "out");
  check_typed(qabsmax, DType::kU8, d, op, "qabsmax");
  check_typed(absmax2, DType::kF32, d, op, "absmax2");
  const int64_t blocks = out.numel();
  LT_CHECK(qabsmax.numel() == blocks &&
               absmax2.numel() == (blocks + kNestedBlockSize - 1) / kNestedBlockSize,
           op, ": qabsmax ", qabsmax.str(), ", absmax2 ", absmax2.str(), " for ", blocks,
           " blocks");
  cu::check_index_range(blocks, op);
  if (blocks == 0) return;
  cu::DeviceGuard g(d);
  DynamicTable table;
  std::memcpy(table.v, kDynamicMap, sizeof(table.v));
  const unsigned grid = cu::grid_blocks(blocks, kThreads, d.index);
  nested_absmax_kernel<<<grid, kThreads, 0, cu::stream_of(d)>>>(
      qabsmax.data<uint8_t>(), absmax2.data<float>(), offset, blocks, out.data<float>(), table);
  CUDA_CHECK_LAUNCH();
}

void nf4_dequantize_cuda(const Tensor& packed, const Tensor& absmax, int64_t n, const Tensor& out) {
  const char* op = "nf4_dequantize_cuda";
  const Device d = out.device();
  cu::check_operand(out, d, op, "out");
  check_typed(packed, DType::kU8, d, op, "packed");
  check_typed(absmax, DType::kF32, d, op, "absmax");
  LT_CHECK(out.numel() == n && packed.numel() == (n + 1) / 2 &&
               absmax.numel() == (n + kNf4BlockSize - 1) / kNf4BlockSize,
           op, ": out ", out.str(), ", packed ", packed.str(), ", absmax ", absmax.str(), " for ",
           n, " elements");
  cu::check_index_range(n, op);
  if (n == 0) return;
  cu::DeviceGuard g(d);
  Nf4Table table;
  std::memcpy(table.v, kNf4Code, sizeof(table.v));
  const bool vec_ok = aligned8(packed.data_ptr()) && cu::aligned16(out.data_ptr());
  const unsigned grid = cu::grid_blocks((n + kChunk - 1) / kChunk, kThreads, d.index);
  cudaStream_t s = cu::stream_of(d);
  LT_CU_DISPATCH_FLOAT(out.dtype(), T, {
    nf4_dequant_kernel<T><<<grid, kThreads, 0, s>>>(packed.data<uint8_t>(), absmax.data<float>(), n,
                                                    static_cast<T*>(out.data_ptr()), table, vec_ok);
  });
  CUDA_CHECK_LAUNCH();
}

void int8_dequantize_cuda(const Tensor& q, const Tensor& absmax, const Tensor& out) {
  const char* op = "int8_dequantize_cuda";
  const Device d = out.device();
  cu::check_operand(out, d, op, "out");
  check_typed(q, DType::kI8, d, op, "q");
  check_typed(absmax, DType::kF32, d, op, "absmax");
  LT_CHECK(q.dim() == 2 && absmax.numel() == q.size(0) && out.numel() == q.numel(), op, ": q ",
           q.str(), ", absmax ", absmax.str(), ", out ", out.str());
  const int64_t rows = q.size(0), cols = q.size(1), n = rows * cols;
  cu::check_index_range(n, op);
  if (n == 0) return;
  cu::DeviceGuard g(d);
  // The same f32 value as the host path's 1/127 (a double rounded once).
  const float inv127 = static_cast<float>(1.0 / 127.0);
  const bool vec_ok = cu::aligned16(q.data_ptr()) && cu::aligned16(out.data_ptr());
  const unsigned grid = cu::grid_blocks((n + kChunk - 1) / kChunk, kThreads, d.index);
  cudaStream_t s = cu::stream_of(d);
  LT_CU_DISPATCH_FLOAT(out.dtype(), T, {
    int8_dequant_kernel<T><<<grid, kThreads, 0, s>>>(q.data<int8_t>(), absmax.data<float>(), rows,
                                                     cols, inv127, static_cast<T*>(out.data_ptr()),
                                                     vec_ok);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace leantune::kernels
