// Shared helpers for the CUDA sources (engine/*.cu, kernels/*.cu, bench/*.cu). Header-only.
//
// Host side: a device guard, the current stream of a device, device properties, tensor checks,
// workspace tensors from the caching allocator, and a dtype dispatch that binds the CUDA storage
// type (float, double, __nv_bfloat16, __half).
// Device side: conversions through the accumulation type (float; double for double), 16-byte
// vectors, warp and block reductions.
//
// Everything lives in namespace leantune::cu (not leantune::cuda, which would shadow libcu++'s
// ::cuda inside namespace leantune).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "engine/check.h"
#include "engine/ops.h"
#include "engine/stream.h"
#include "engine/tensor.h"

namespace leantune::cu {

// ---------------------------------------------------------------- host: devices and streams

// Makes `device` current for the scope (kernels launch on the current device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : target_(device) {
    CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) CUDA_CHECK(cudaSetDevice(device));
  }
  explicit DeviceGuard(Device d) : DeviceGuard(d.index) {}
  ~DeviceGuard() {
    if (prev_ != target_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  int target_ = 0;
};

// The stream ops on `d` run on (never the legacy default stream).
inline cudaStream_t stream_of(Device d) {
  return static_cast<cudaStream_t>(current_stream(d).handle);
}

struct DeviceInfo {
  int sm_count = 0;
  int max_threads_per_sm = 0;
  size_t l2_bytes = 0;
  int major = 0;
};

inline const DeviceInfo& device_info(int device) {
  static std::mutex mu;
  static std::vector<DeviceInfo> cache;
  std::lock_guard<std::mutex> lk(mu);
  if (cache.size() <= static_cast<size_t>(device)) cache.resize(device + 1);
  DeviceInfo& info = cache[device];
  if (info.sm_count == 0) {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    info.sm_count = prop.multiProcessorCount;
    info.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
    info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
    info.major = prop.major;
  }
  return info;
}

// Blocks for a grid-stride loop over `work` items of `per_block` each: enough to fill the
// device `waves` times over, never more than the work needs (and at least 1).
inline unsigned grid_blocks(int64_t work, int64_t per_block, int device, int waves = 4,
                            int threads = 256) {
  const int64_t needed = (work + per_block - 1) / per_block;
  const DeviceInfo& info = device_info(device);
  const int64_t fill =
      static_cast<int64_t>(info.sm_count) * std::max(1, info.max_threads_per_sm / threads) * waves;
  const int64_t b = std::min(needed, std::max<int64_t>(fill, 1));
  return static_cast<unsigned>(std::max<int64_t>(b, 1));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---------------------------------------------------------------- host: tensor checks

inline void check_on(const Tensor& t, Device d, const char* op, const char* name) {
  LT_CHECK(t.defined(), op, ": ", name, " is undefined");
  LT_CHECK(t.device() == d, op, ": ", name, " ", t.str(), " is not on ", d.str());
}
inline void check_contiguous(const Tensor& t, const char* op, const char* name) {
  LT_CHECK(t.is_contiguous(), op, ": ", name, " ", t.str(), " must be contiguous");
}
inline void check_dtype(const Tensor& t, DType dt, const char* op, const char* name) {
  LT_CHECK(t.dtype() == dt, op, ": ", name, " ", t.str(), " must be ", dtype_name(dt));
}
inline void check_shape(const Tensor& t, const Shape& s, const char* op, const char* name) {
  LT_CHECK(t.shape() == s, op, ": ", name, " ", t.str(), " must have shape ", shape_str(s));
}
// A device, contiguous tensor on `d` (the usual demand on kernel operands).
inline void check_operand(const Tensor& t, Device d, const char* op, const char* name) {
  check_on(t, d, op, name);
  check_contiguous(t, op, name);
}
// The kernels index with int64 but launch grids in int32 units; guard absurd sizes early.
inline void check_index_range(int64_t n, const char* op) {
  LT_CHECK(n >= 0 && n < (int64_t{1} << 62), op, ": size ", n, " out of range");
}

// Scratch memory from the caching allocator, tagged kWorkspace, on the current stream.
inline Tensor workspace(size_t bytes, Device d) {
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, d, MemTag::kWorkspace);
}

// t itself when contiguous, else a contiguous copy (kWorkspace). No autograd history.
inline Tensor contiguous_ws(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  ops::copy(c, t);
  return c;
}
// t contiguous and 16-byte aligned, for kernels that read whole 16-byte vectors: t itself, or a
// copy (kWorkspace).
inline Tensor aligned16_ws(const Tensor& t) {
  Tensor c = contiguous_ws(t);
  if (aligned16(c.data_ptr())) return c;
  Tensor a = Tensor::empty(c.shape(), c.dtype(), c.device(), MemTag::kWorkspace);
  ops::copy(a, c);
  return a;
}
// An output the kernels write (contiguous): the tensor itself, or, when `need_align16` and it is
// not 16-byte aligned, a workspace that finish() copies into it. An undefined output stays
// undefined (ptr() null).
struct OutOperand {
  Tensor target, buf;
  void* ptr() const { return buf.defined() ? buf.data_ptr() : nullptr; }
  void finish() const {
    if (buf.defined() && buf.data_ptr() != target.data_ptr()) ops::copy(target, buf);
  }
};
inline OutOperand out_operand(const Tensor& t, bool need_align16) {
  OutOperand o{t, t};
  if (t.defined() && need_align16 && !aligned16(t.data_ptr()))
    o.buf = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  return o;
}
// t on device d, contiguous: uploads a host tensor (small index and table operands).
inline Tensor on_device_ws(const Tensor& t, Device d) {
  if (t.device() == d) return contiguous_ws(t);
  Tensor c = Tensor::empty(t.shape(), t.dtype(), d, MemTag::kWorkspace);
  ops::copy(c, t);
  return c;
}

// Out-of-range ids reported by a kernel: the smallest bad position, or none. Kernels that gather
// by id skip a bad row (no out-of-bounds access) and report it; the host then throws an Error
// that names the id. Reading the flag synchronises the stream.
class BadIndexFlag {
 public:
  BadIndexFlag(Device d, cudaStream_t s) : buf_(workspace(sizeof(unsigned long long), d)), s_(s) {
    CUDA_CHECK(cudaMemsetAsync(buf_.data_ptr(), 0xff, sizeof(unsigned long long), s_));
  }
  unsigned long long* ptr() const { return static_cast<unsigned long long*>(buf_.data_ptr()); }
  // -1 when every id was in range.
  int64_t first_bad() const {
    unsigned long long v = 0;
    CUDA_CHECK(cudaMemcpyAsync(&v, ptr(), sizeof(v), cudaMemcpyDeviceToHost, s_));
    CUDA_CHECK(cudaStreamSynchronize(s_));
    return v == ~0ull ? -1 : static_cast<int64_t>(v);
  }

 private:
  Tensor buf_;
  cudaStream_t s_;
};

// ---------------------------------------------------------------- dtype dispatch

template <typename T>
using acc_of = float_acc_t<T>;

}  // namespace leantune::cu

// Binds T to the CUDA storage type of a floating dtype.
#define LT_CU_DISPATCH_FLOAT(dtype, T, ...)                                           \
  switch (dtype) {                                                                    \
    LT_FLOAT_DTYPE_CASES(T, __nv_bfloat16, __half, __VA_ARGS__)                       \
    default:                                                                          \
      LT_THROW(::leantune::ErrorKind::kInternal, "unsupported dtype ",                \
               ::leantune::dtype_name(dtype), " on CUDA (expected a floating type)"); \
  }

// f32, bf16 and f16 only: the fused kernels do not instantiate f64 (CPU covers f64 checks).
#define LT_CU_DISPATCH_F32_16(dtype, T, ...)                                              \
  switch (dtype) {                                                                        \
    LT_DTYPE_CASE(kF32, T, float, __VA_ARGS__)                                            \
    LT_DTYPE_CASE(kBF16, T, __nv_bfloat16, __VA_ARGS__)                                   \
    LT_DTYPE_CASE(kF16, T, __half, __VA_ARGS__)                                           \
    default:                                                                              \
      LT_THROW(::leantune::ErrorKind::kInternal, "dtype ", ::leantune::dtype_name(dtype), \
               " is unsupported on CUDA for this op (use f32, bf16 or f16)");             \
  }

// Binds I to the index type of an i32/i64 tensor.
#define LT_CU_DISPATCH_INDEX(dtype, I, ...)                                                     \
  switch (dtype) {                                                                              \
    LT_DTYPE_CASE(kI32, I, int32_t, __VA_ARGS__)                                                \
    LT_DTYPE_CASE(kI64, I, int64_t, __VA_ARGS__)                                                \
    default:                                                                                    \
      LT_THROW(::leantune::ErrorKind::kInternal, "index dtype ", ::leantune::dtype_name(dtype), \
               " must be i32 or i64");                                                          \
  }

namespace leantune::cu {

// ---------------------------------------------------------------- device: conversions

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }

// Element `high` (0: the low half, 1: the high half) of two bf16 packed in a 32-bit word, widened
// exactly as __bfloat162float does: a bf16 is the top half of its f32, so one shift or one mask,
// where the compiler otherwise extracts the high half with a permute first.
__device__ __forceinline__ float bf16_in_word(uint32_t w, int high) {
  return __uint_as_float(high ? (w & 0xffff0000u) : (w << 16));
}

// Round-to-nearest-even from the accumulation type, as engine/dtype.h does on the host (a
// double goes through float first, as cpu::from_double does).
template <typename T, typename A>
__device__ __forceinline__ T from_acc(A v) {
  if constexpr (std::is_same_v<T, double>) {
    return static_cast<double>(v);
  } else {
    const float f = static_cast<float>(v);
    if constexpr (std::is_same_v<T, float>)
      return f;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
      return __float2bfloat16_rn(f);
    else
      return __float2half_rn(f);
  }
}

// IEEE-rounded products and sums that the compiler may not fuse into an FMA: the CPU reference
// (x86-64 without -mfma) rounds each operation, so these keep results bit-comparable.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// ---------------------------------------------------------------- device: 16-byte vectors

template <typename T>
struct VecWidth {
  static constexpr int value = static_cast<int>(16 / sizeof(T));
};

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// N consecutive elements at p (16-byte aligned when N * sizeof(T) == 16) into acc values.
template <typename T, int N, typename A>
__device__ __forceinline__ void load_vec(const T* p, A (&out)[N]) {
  const Vec<T, N> raw = *reinterpret_cast<const Vec<T, N>*>(p);
  if constexpr (std::is_same_v<T, __nv_bfloat16> && std::is_same_v<A, float> && N % 2 == 0) {
    uint32_t w[N / 2];
    memcpy(w, &raw, sizeof(w));
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = bf16_in_word(w[j / 2], j & 1);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_acc(raw.v[j]);
  }
}
template <typename T, int N, typename A>
__device__ __forceinline__ void store_vec(T* p, const A (&in)[N]) {
  Vec<T, N> raw;
#pragma unroll
  for (int j = 0; j < N; ++j) raw.v[j] = from_acc<T>(in[j]);
  *reinterpret_cast<Vec<T, N>*>(p) = raw;
}
// Streaming store (evict-first): for outputs that the next kernel does not read soon.
template <typename T, int N, typename A>
__device__ __forceinline__ void store_vec_cs(T* p, const A (&in)[N]) {
  if constexpr (sizeof(T) * N == 16) {
    Vec<T, N> raw;
#pragma unroll
    for (int j = 0; j < N; ++j) raw.v[j] = from_acc<T>(in[j]);
    __stcs(reinterpret_cast<float4*>(p), *reinterpret_cast<const float4*>(&raw));
  } else {
    store_vec<T, N>(p, in);
  }
}

// ---------------------------------------------------------------- device: reductions

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a group of `width` consecutive lanes (width a power of two <= 32), result in all of
// them.
template <typename A>
__device__ __forceinline__ A group_sum(A v, int width) {
  for (int o = width >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over all threads of a block with blockDim.x a multiple of 32 (<= 1024); every thread
// gets the total. `scratch` holds 32 values; the call synchronises and may be repeated.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A t = lane < nwarps ? scratch[lane] : A(0);
  return warp_sum(t);
}

__device__ __forceinline__ void report_bad_index(unsigned long long* first_bad, int64_t pos) {
  atomicMin(first_bad, static_cast<unsigned long long>(pos));
}

// out[i, :] = table[ids[i], :] for i < n: ids i32|i64 (id_type) on the device, rows of row_bytes
// moved as 16-byte words when the rows and pointers allow, else as elem_bytes words. A bad id
// leaves its row unwritten and is recorded in first_bad (BadIndexFlag). The one row-gather
// kernel (engine/ops_cuda_gather.cu), used by index_rows and the embedding forward.
void gather_rows(const void* table, const void* ids, DType id_type, void* out, int64_t n,
                 int64_t v_rows, int64_t row_bytes, size_t elem_bytes,
                 unsigned long long* first_bad, Device dev, cudaStream_t stream);

// Online softmax state: running max m and sum s of exp(x - m). Merging is exact in the sense
// that any order gives the same result up to rounding; an empty state is (-inf, 0).
struct MaxSum {
  float m;
  float s;
};
__device__ __forceinline__ MaxSum max_sum_merge(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

}  // namespace leantune::cu
