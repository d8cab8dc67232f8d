// CUDA implementations of the raw ops (engine/ops_cuda.h), called by engine/ops.cpp's dispatch,
// plus the cuBLASLt/cuBLAS wrappers and the column reduction declared in engine/cuda_blas.cuh.
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
#include <cublasLt.h>
#include <cublas_v2.h>

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

namespace leantune::cuda_ops {
namespace {

using cu::acc_of;
using cu::add_rn;
using cu::mul_rn;

constexpr int kThreads = 256;

// ---------------------------------------------------------------- strided layouts

// Up to kMaxDims dimensions after coalescing, outermost first, with one stride per operand.
constexpr int kMaxDims = 8;
struct Layout {
  int nd = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[2][kMaxDims] = {};
};

// Drops size-1 dimensions and merges neighbours that are contiguous in every operand, so that
// most strided views become one or two dimensions.
Layout coalesce(const Shape& shape, const Shape* strides[], int nops) {
  Layout out;
  int64_t size[64];
  int64_t st[2][64];
  int nd = 0;
  LT_CHECK(shape.size() <= 64, "too many dimensions: ", shape_str(shape));
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (nd > 0) {
      bool merge = true;
      for (int o = 0; o < nops; ++o)
        if ((*strides[o])[d] != st[o][nd - 1] * size[nd - 1]) merge = false;
      if (merge) {
        size[nd - 1] *= shape[d];
        continue;
      }
    }
    size[nd] = shape[d];
    for (int o = 0; o < nops; ++o) st[o][nd] = (*strides[o])[d];
    ++nd;
  }
  LT_CHECK(nd <= kMaxDims, "strided copy with ", nd, " non-mergeable dimensions (max ", kMaxDims,
           ")");
  out.nd = nd;
  for (int i = 0; i < nd; ++i) {  // reverse: outermost first
    out.size[i] = size[nd - 1 - i];
    for (int o = 0; o < nops; ++o) out.stride[o][i] = st[o][nd - 1 - i];
  }
  return out;
}

__device__ __forceinline__ void layout_offsets(const Layout& L, int64_t i, int64_t* o0,
                                               int64_t* o1) {
  int64_t a = 0, b = 0;
  for (int d = L.nd - 1; d >= 0; --d) {
    const int64_t sz = L.size[d];
    const int64_t idx = i % sz;
    i /= sz;
    a += idx * L.stride[0][d];
    b += idx * L.stride[1][d];
  }
  *o0 = a;
  *o1 = b;
}

template <int kBytes>
struct RawOf;
template <>
struct RawOf<1> {
  using type = uint8_t;
};
template <>
struct RawOf<2> {
  using type = uint16_t;
};
template <>
struct RawOf<4> {
  using type = uint32_t;
};
template <>
struct RawOf<8> {
  using type = uint64_t;
};
template <>
struct RawOf<16> {
  using type = uint4;
};

// Same dtype, any strides: dst[layout 0] = src[layout 1], moved as raw element bytes.
template <int kBytes>
__global__ void copy_strided_kernel(const void* __restrict__ src, void* __restrict__ dst, Layout L,
                                    int64_t n) {
  using R = typename RawOf<kBytes>::type;
  const R* s = static_cast<const R*>(src);
  R* d = static_cast<R*>(dst);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t od, os;
    layout_offsets(L, i, &od, &os);
    d[od] = s[os];
  }
}

// Element read as double / written from double, for every numeric dtype (the host converts
// through double too: engine/cpu_kernels.h).
__device__ double load_as_double(const void* p, int64_t i, DType dt) {
  switch (dt) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF64:
      return static_cast<const double*>(p)[i];
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(p)[i];
    case DType::kI16:
      return static_cast<const int16_t*>(p)[i];
    case DType::kI8:
      return static_cast<const int8_t*>(p)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::kU16:
      return static_cast<const uint16_t*>(p)[i];
    case DType::kU32:
      return static_cast<const uint32_t*>(p)[i];
    case DType::kU64:
      return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DType::kBool:
      return static_cast<const bool*>(p)[i] ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}
__device__ void store_from_double(void* p, int64_t i, DType dt, double v) {
  switch (dt) {
    case DType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      static_cast<double*>(p)[i] = v;
      break;
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v));
      break;
    case DType::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v));
      break;
    case DType::kI64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::kI32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::kI16:
      static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v);
      break;
    case DType::kI8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DType::kU8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DType::kU16:
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v);
      break;
    case DType::kU32:
      static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v);
      break;
    case DType::kU64:
      static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v);
      break;
    case DType::kBool:
      static_cast<bool*>(p)[i] = v != 0.0;
      break;
    default:
      break;
  }
}

// Any dtypes, any strides: dst[layout 0] = convert(src[layout 1]).
__global__ void convert_strided_kernel(const void* __restrict__ src, DType sdt,
                                       void* __restrict__ dst, DType ddt, Layout L, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t od, os;
    layout_offsets(L, i, &od, &os);
    store_from_double(dst, od, ddt, load_as_double(src, os, sdt));
  }
}

// Contiguous conversions between f32, bf16 and f16 (the hot ones: master weights, gradients),
// N elements per step. Converting through f32 equals converting through double here.
template <typename S, typename D, int N>
__global__ void convert_contig_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t v = tid; v < nvec; v += stride) {
    float x[N];
    cu::load_vec<S, N>(src + v * N, x);
    cu::store_vec<D, N>(dst + v * N, x);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) dst[i] = cu::from_acc<D>(cu::to_acc(src[i]));
}

template <int kBytes>
__global__ void fill_kernel(void* __restrict__ dst, Layout L, int64_t n, uint64_t pattern,
                            bool contiguous) {
  using R = typename RawOf<kBytes>::type;
  R* d = static_cast<R*>(dst);
  const R v = static_cast<R>(pattern);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (contiguous) {
      d[i] = v;
    } else {
      int64_t od, unused;
      layout_offsets(L, i, &od, &unused);
      d[od] = v;
    }
  }
}

unsigned blocks_for(int64_t n, Device d) { return cu::grid_blocks(n, kThreads, d.index); }

// Strided element base pointer: the storage start plus the tensor's offset.
void* base_ptr(const Tensor& t) {
  return static_cast<char*>(t.storage()->data()) +
         t.offset() * static_cast<int64_t>(t.element_size());
}

// dst = src on one device.
void same_device_copy(const Tensor& dst, const Tensor& src) {
  const Device d = dst.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const bool contig = dst.is_contiguous() && src.is_contiguous();
  if (dst.dtype() == src.dtype() && contig) {
    CUDA_CHECK(
        cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  auto is_f = [](DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; };
  if (contig && is_f(dst.dtype()) && is_f(src.dtype())) {
    const bool vec = cu::aligned16(src.data_ptr()) && cu::aligned16(dst.data_ptr());
    const unsigned blocks = blocks_for(vec ? (n + 3) / 4 : n, d);
    LT_CU_DISPATCH_F32_16(src.dtype(), S, {
      LT_CU_DISPATCH_F32_16(dst.dtype(), D, {
        const S* sp = static_cast<const S*>(src.data_ptr());
        D* dp = static_cast<D*>(dst.data_ptr());
        if (vec)
          convert_contig_kernel<S, D, 4><<<blocks, kThreads, 0, s>>>(sp, dp, n);
        else
          convert_contig_kernel<S, D, 1><<<blocks, kThreads, 0, s>>>(sp, dp, n);
        CUDA_CHECK_LAUNCH();
      });
    });
    return;
  }
  const Shape* strides[2] = {&dst.strides(), &src.strides()};
  const Layout L = coalesce(dst.shape(), strides, 2);
  const unsigned blocks = blocks_for(n, d);
  if (dst.dtype() == src.dtype()) {
    switch (dst.element_size()) {
      case 1:
        copy_strided_kernel<1><<<blocks, kThreads, 0, s>>>(base_ptr(src), base_ptr(dst), L, n);
        break;
      case 2:
        copy_strided_kernel<2><<<blocks, kThreads, 0, s>>>(base_ptr(src), base_ptr(dst), L, n);
        break;
      case 4:
        copy_strided_kernel<4><<<blocks, kThreads, 0, s>>>(base_ptr(src), base_ptr(dst), L, n);
        break;
      case 8:
        copy_strided_kernel<8><<<blocks, kThreads, 0, s>>>(base_ptr(src), base_ptr(dst), L, n);
        break;
      default:
        LT_THROW(ErrorKind::kInternal, "copy: element size ", dst.element_size());
    }
    CUDA_CHECK_LAUNCH();
    return;
  }
  LT_CHECK(dtype_size(src.dtype()) <= 8 && dtype_size(dst.dtype()) <= 8 &&
               src.dtype() != DType::kF8E4M3 && src.dtype() != DType::kF8E5M2 &&
               dst.dtype() != DType::kF8E4M3 && dst.dtype() != DType::kF8E5M2,
           "copy: no conversion from ", dtype_name(src.dtype()), " to ", dtype_name(dst.dtype()));
  convert_strided_kernel<<<blocks, kThreads, 0, s>>>(base_ptr(src), src.dtype(), base_ptr(dst),
                                                     dst.dtype(), L, n);
  CUDA_CHECK_LAUNCH();
}

Tensor contiguous_on_device(const Tensor& t, MemTag tag = MemTag::kWorkspace) {
  if (t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device(), tag);
  same_device_copy(out, t);
  return out;
}

void host_to_device(const Tensor& dst, const Tensor& src) {
  // The host converts and gathers (engine/ops.cpp), so only bytes of dst's dtype travel.
  Tensor staged = src;
  if (src.dtype() != dst.dtype() || !src.is_contiguous()) {
    staged = Tensor::empty(src.shape(), dst.dtype(), Device::cpu(), MemTag::kWorkspace);
    ops::copy(staged, src);
  }
  const Device d = dst.device();
  cu::DeviceGuard g(d);
  const Stream stream = current_stream(d);
  cudaStream_t s = static_cast<cudaStream_t>(stream.handle);
  Tensor target =
      dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), d, MemTag::kWorkspace);
  CUDA_CHECK(cudaMemcpyAsync(target.data_ptr(), staged.data_ptr(), staged.nbytes(),
                             cudaMemcpyHostToDevice, s));
  // Pinned memory is read asynchronously: keep its block from reuse until the copy is done.
  // (Pageable memory was staged by the driver before cudaMemcpyAsync returned.)
  if (staged.storage()->is_pinned()) staged.storage()->record_stream(stream);
  if (!dst.is_contiguous()) same_device_copy(dst, target);
}

void device_to_host(const Tensor& dst, const Tensor& src) {
  const Device d = src.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  Tensor srcc = contiguous_on_device(src);
  const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype();
  Tensor host =
      direct ? dst : Tensor::empty(src.shape(), src.dtype(), Device::cpu(), MemTag::kWorkspace);
  CUDA_CHECK(
      cudaMemcpyAsync(host.data_ptr(), srcc.data_ptr(), srcc.nbytes(), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  if (!direct) ops::copy(dst, host);
}

// An event on `from`'s device recorded on its current stream, waited for by `to`'s stream.
void stream_wait(Device to, Device from) {
  cudaEvent_t ev;
  {
    cu::DeviceGuard g(from);
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ev, cu::stream_of(from)));
  }
  cu::DeviceGuard g(to);
  const cudaError_t err = cudaStreamWaitEvent(cu::stream_of(to), ev, 0);
  CUDA_CHECK(cudaEventDestroy(ev));
  CUDA_CHECK(err);
}

void cross_device_copy(const Tensor& dst, const Tensor& src) {
  const Device sd = src.device(), dd = dst.device();
  Tensor srcc;
  {
    cu::DeviceGuard g(sd);
    srcc = contiguous_on_device(src);
  }
  Tensor target;
  {
    cu::DeviceGuard g(dd);
    target = dst.is_contiguous() && dst.dtype() == src.dtype()
                 ? dst
                 : Tensor::empty(src.shape(), src.dtype(), dd, MemTag::kWorkspace);
  }
  stream_wait(sd, dd);  // dst's earlier users are done before it is overwritten
  {
    cu::DeviceGuard g(sd);
    CUDA_CHECK(cudaMemcpyPeerAsync(target.data_ptr(), dd.index, srcc.data_ptr(), sd.index,
                                   srcc.nbytes(), cu::stream_of(sd)));
  }
  stream_wait(dd, sd);
  if (!target.shares_storage(dst) || target.offset() != dst.offset()) same_device_copy(dst, target);
}

// The raw bit pattern of `value` in dtype dt, as the host's fill writes it.
uint64_t fill_pattern(DType dt, double value) {
  uint64_t pattern = 0;
  LT_DISPATCH_ALL(dt, T, {
    const T v = cpu::from_double<T>(value);
    static_assert(sizeof(T) <= sizeof(uint64_t));
    std::memcpy(&pattern, &v, sizeof(T));
  });
  return pattern;
}

// ---------------------------------------------------------------- elementwise

enum class Bcast : int { kSame = 0, kScalar = 1, kRow = 2 };

Bcast broadcast_kind(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() == b.shape()) return Bcast::kSame;
  if (b.numel() == 1) return Bcast::kScalar;
  const auto& as = a.shape();
  const auto& bs = b.shape();
  if (bs.size() <= as.size() && std::equal(bs.begin(), bs.end(), as.end() - bs.size()))
    return Bcast::kRow;
  LT_THROW(ErrorKind::kInternal, op, ": shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()), " do not match");
}

enum class BinOp : int { kAdd, kMul, kDiv };

template <BinOp kOp, typename A>
__device__ __forceinline__ A binary_apply(A x, A y, A alpha) {
  if constexpr (kOp == BinOp::kAdd)
    return add_rn(x, mul_rn(alpha, y));
  else if constexpr (kOp == BinOp::kMul)
    return mul_rn(x, y);
  else
    return x / y;
}

// out[i] = op(a[i], b[j]) with j = i (same), 0 (scalar) or i % bn (row). out may alias a.
// N elements per step with 16-byte accesses when N > 1 (the host checks alignment).
template <typename T, BinOp kOp, int N>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n, int64_t bn, Bcast kind,
                              acc_of<T> alpha) {
  using A = acc_of<T>;
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const A scalar = kind == Bcast::kScalar ? cu::to_acc(b[0]) : A(0);
  for (int64_t v = tid; v < nvec; v += stride) {
    const int64_t i0 = v * N;
    A x[N], y[N], r[N];
    if constexpr (N > 1) {
      cu::load_vec<T, N>(a + i0, x);
      if (kind == Bcast::kSame) cu::load_vec<T, N>(b + i0, y);
    } else {
      x[0] = cu::to_acc(a[i0]);
      if (kind == Bcast::kSame) y[0] = cu::to_acc(b[i0]);
    }
    if (kind == Bcast::kScalar) {
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = scalar;
    } else if (kind == Bcast::kRow) {
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = cu::to_acc(b[(i0 + j) % bn]);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = binary_apply<kOp>(x[j], y[j], alpha);
    if constexpr (N > 1)
      cu::store_vec<T, N>(out + i0, r);
    else
      out[i0] = cu::from_acc<T>(r[0]);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    const A y = kind == Bcast::kSame ? cu::to_acc(b[i])
                                     : (kind == Bcast::kScalar ? scalar : cu::to_acc(b[i % bn]));
    out[i] = cu::from_acc<T>(binary_apply<kOp>(cu::to_acc(a[i]), y, alpha));
  }
}

template <BinOp kOp>
void binary_launch(const Tensor& out, const Tensor& a, const Tensor& b, Bcast kind, double alpha) {
  const Device d = a.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const int64_t n = a.numel();
  if (n == 0) return;
  const int64_t bn = std::max<int64_t>(b.numel(), 1);
  LT_CU_DISPATCH_FLOAT(a.dtype(), T, {
    using A = acc_of<T>;
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec =
        cu::aligned16(pa) && cu::aligned16(po) && (kind != Bcast::kSame || cu::aligned16(pb));
    const unsigned blocks = blocks_for(vec ? (n + kVec - 1) / kVec : n, d);
    if (vec)
      binary_kernel<T, kOp, kVec>
          <<<blocks, kThreads, 0, s>>>(pa, pb, po, n, bn, kind, static_cast<A>(alpha));
    else
      binary_kernel<T, kOp, 1>
          <<<blocks, kThreads, 0, s>>>(pa, pb, po, n, bn, kind, static_cast<A>(alpha));
    CUDA_CHECK_LAUNCH();
  });
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  LT_CHECK(a.device() == b.device(), op, ": tensors on ", a.device().str(), " and ",
           b.device().str());
}

// b in a's dtype, contiguous (the host does the same conversion first).
Tensor prep_b(const Tensor& b, const Tensor& a) {
  Tensor r = b.dtype() == a.dtype() ? b : b.to(a.dtype());
  return r.is_contiguous() ? r : r.contiguous();
}

template <BinOp kOp>
Tensor binary_out(const Tensor& a0, const Tensor& b0, double alpha, const char* name) {
  check_same_device(a0, b0, name);
  Tensor a = a0.is_contiguous() ? a0 : a0.contiguous();
  Tensor b = prep_b(b0, a);
  const Bcast kind = broadcast_kind(a, b, name);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device(), current_mem_tag());
  binary_launch<kOp>(out, a, b, kind, alpha);
  return out;
}

template <BinOp kOp>
void binary_inplace(const Tensor& a, const Tensor& b0, double alpha, const char* name) {
  check_same_device(a, b0, name);
  LT_CHECK(a.is_contiguous(), name, " in place on non-contiguous ", a.str());
  Tensor b = prep_b(b0, a);
  const Bcast kind = broadcast_kind(a, b, name);
  binary_launch<kOp>(a, a, b, kind, alpha);
}

// Unary ops: ops::Unary values, then affine (x * alpha + beta) and scale (x * alpha).
constexpr int kUnaryAffine = 100;
constexpr int kUnaryScale = 101;

template <typename A>
__device__ __forceinline__ A sigmoid_acc(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
  } else {
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
  }
}

template <typename A>
__device__ __forceinline__ A unary_apply(A v, int op, A alpha, A beta) {
  constexpr bool kF = std::is_same_v<A, float>;
  switch (op) {
    case static_cast<int>(ops::Unary::kNeg):
      return -v;
    case static_cast<int>(ops::Unary::kExp):
      if constexpr (kF)
        return expf(v);
      else
        return exp(v);
    case static_cast<int>(ops::Unary::kLog):
      if constexpr (kF)
        return logf(v);
      else
        return log(v);
    case static_cast<int>(ops::Unary::kSigmoid):
      return sigmoid_acc(v);
    case static_cast<int>(ops::Unary::kLogSigmoid):
      if constexpr (kF)
        return v >= 0 ? -log1pf(expf(-v)) : v - log1pf(expf(v));
      else
        return v >= 0 ? -log1p(exp(-v)) : v - log1p(exp(v));
    case static_cast<int>(ops::Unary::kTanh):
      if constexpr (kF)
        return tanhf(v);
      else
        return tanh(v);
    case static_cast<int>(ops::Unary::kRelu):
      return v > 0 ? v : A(0);
    case static_cast<int>(ops::Unary::kSquare):
      return mul_rn(v, v);
    case static_cast<int>(ops::Unary::kSqrt):
      if constexpr (kF)
        return sqrtf(v);
      else
        return sqrt(v);
    case static_cast<int>(ops::Unary::kAbs):
      return fabs(v);
    case static_cast<int>(ops::Unary::kSilu):
      return mul_rn(v, sigmoid_acc(v));
    case kUnaryAffine:
      return add_rn(mul_rn(v, alpha), beta);
    case kUnaryScale:
      return mul_rn(v, alpha);
    default:
      return v;
  }
}

// y[i] = f(x[i]); y may alias x.
template <typename T, int N>
__global__ void unary_kernel(const T* x, T* y, int64_t n, int op, acc_of<T> alpha, acc_of<T> beta) {
  using A = acc_of<T>;
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t v = tid; v < nvec; v += stride) {
    A r[N];
    if constexpr (N > 1) {
      cu::load_vec<T, N>(x + v * N, r);
#pragma unroll
      for (int j = 0; j < N; ++j) r[j] = unary_apply(r[j], op, alpha, beta);
      cu::store_vec<T, N>(y + v * N, r);
    } else {
      y[v] = cu::from_acc<T>(unary_apply(cu::to_acc(x[v]), op, alpha, beta));
    }
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride)
    y[i] = cu::from_acc<T>(unary_apply(cu::to_acc(x[i]), op, alpha, beta));
}

void unary_launch(const Tensor& y, const Tensor& x, int op, double alpha, double beta) {
  const Device d = x.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const int64_t n = x.numel();
  if (n == 0) return;
  LT_CU_DISPATCH_FLOAT(x.dtype(), T, {
    using A = acc_of<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = cu::aligned16(px) && cu::aligned16(py);
    const unsigned blocks = blocks_for(vec ? (n + kVec - 1) / kVec : n, d);
    if (vec)
      unary_kernel<T, kVec>
          <<<blocks, kThreads, 0, s>>>(px, py, n, op, static_cast<A>(alpha), static_cast<A>(beta));
    else
      unary_kernel<T, 1>
          <<<blocks, kThreads, 0, s>>>(px, py, n, op, static_cast<A>(alpha), static_cast<A>(beta));
    CUDA_CHECK_LAUNCH();
  });
}

Tensor unary_out(const Tensor& x0, int op, double alpha, double beta) {
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), current_mem_tag());
  unary_launch(y, x, op, alpha, beta);
  return y;
}

// ---------------------------------------------------------------- full reductions

enum class RMode : int { kSum, kSumSq, kMaxAbs, kNonFinite };

// NaN-propagating max (the host's max_abs returns NaN when any element is NaN).
__device__ __forceinline__ double max_nan(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  return fmax(a, b);
}

__device__ __forceinline__ double rmode_elem(double v, RMode mode) {
  switch (mode) {
    case RMode::kSum:
      return v;
    case RMode::kSumSq:
      return __dmul_rn(v, v);
    case RMode::kMaxAbs:
      return fabs(v);
    default:
      return isfinite(v) ? 0.0 : 1.0;
  }
}
__device__ __forceinline__ double rmode_combine(double a, double b, RMode mode) {
  return mode == RMode::kMaxAbs ? max_nan(a, b) : a + b;
}

// One double partial per block (grid-stride; fixed grid => fixed order => deterministic).
template <typename T, int N>
__global__ void reduce_partials_kernel(const T* __restrict__ x, int64_t n, RMode mode,
                                       double* __restrict__ partials) {
  __shared__ double scratch[32];
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  double acc = 0.0;
  for (int64_t v = tid; v < nvec; v += stride) {
    acc_of<T> r[N];
    if constexpr (N > 1) {
      cu::load_vec<T, N>(x + v * N, r);
    } else {
      r[0] = cu::to_acc(x[v]);
    }
#pragma unroll
    for (int j = 0; j < N; ++j)
      acc = rmode_combine(acc, rmode_elem(static_cast<double>(r[j]), mode), mode);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride)
    acc = rmode_combine(acc, rmode_elem(static_cast<double>(cu::to_acc(x[i])), mode), mode);
  // Block combine in a fixed tree order.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    acc = rmode_combine(acc, __shfl_xor_sync(0xffffffffu, acc, o), mode);
  if (lane == 0) scratch[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    double t = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t = rmode_combine(t, __shfl_xor_sync(0xffffffffu, t, o), mode);
    if (lane == 0) partials[blockIdx.x] = t;
  }
}

template <typename O>
__global__ void finalize_sum_kernel(const double* __restrict__ partials, int np, O* out) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < np; i += blockDim.x) acc += partials[i];
  acc = cu::block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = static_cast<O>(acc);
}

// Per-block partials of `mode` over x (contiguous); returns the partials tensor (f64, device).
Tensor reduce_partials(const Tensor& x, RMode mode) {
  const Device d = x.device();
  cudaStream_t s = cu::stream_of(d);
  const int64_t n = x.numel();
  const int sms = cu::device_info(d.index).sm_count;
  Tensor partials;
  LT_CU_DISPATCH_FLOAT(x.dtype(), T, {
    const T* px = static_cast<const T*>(x.data_ptr());
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = cu::aligned16(px);
    const int64_t items = vec ? (n + kVec - 1) / kVec : n;
    const int64_t blocks = std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, 4 * sms);
    partials = Tensor::empty({blocks}, DType::kF64, d, MemTag::kWorkspace);
    double* pp = partials.data<double>();
    if (vec)
      reduce_partials_kernel<T, kVec>
          <<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(px, n, mode, pp);
    else
      reduce_partials_kernel<T, 1>
          <<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(px, n, mode, pp);
    CUDA_CHECK_LAUNCH();
  });
  return partials;
}

// The partials combined on the host in index order (synchronises).
double reduce_to_host(const Tensor& x0, RMode mode) {
  if (x0.numel() == 0) return 0.0;
  cu::DeviceGuard g(x0.device());
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  Tensor partials = reduce_partials(x, mode);
  std::vector<double> host(static_cast<size_t>(partials.numel()));
  cudaStream_t s = cu::stream_of(x.device());
  CUDA_CHECK(cudaMemcpyAsync(host.data(), partials.data_ptr(), host.size() * sizeof(double),
                             cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  double acc = 0.0;
  bool nan = false;
  for (double v : host) {
    if (mode == RMode::kMaxAbs) {
      if (std::isnan(v)) nan = true;
      acc = std::max(acc, v);
    } else {
      acc += v;
    }
  }
  return nan ? std::numeric_limits<double>::quiet_NaN() : acc;
}

// ---------------------------------------------------------------- dimension reductions

// out[o, i] = sum_k x[o, k, i] for k in [k0, k1) of this split; double accumulation. With one
// split the result goes straight to `out` (x's dtype), else to partials[split][o * inner + i].
template <typename T>
__global__ void sum_dim_kernel(const T* __restrict__ x, int64_t outer, int64_t n, int64_t inner,
                               int64_t k_per_split, T* __restrict__ out,
                               double* __restrict__ partials) {
  const int64_t cols = outer * inner;
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  const int64_t o = col / inner, i = col % inner;
  const int64_t k0 = blockIdx.y * k_per_split;
  const int64_t k1 = std::min(n, k0 + k_per_split);
  double acc = 0.0;
  for (int64_t k = k0; k < k1; ++k)
    acc += static_cast<double>(cu::to_acc(x[(o * n + k) * inner + i]));
  if (partials)
    partials[blockIdx.y * cols + col] = acc;
  else
    out[col] = cu::from_acc<T>(static_cast<acc_of<T>>(acc));
}

template <typename T>
__global__ void sum_splits_kernel(const double* __restrict__ partials, int64_t splits, int64_t cols,
                                  T* __restrict__ out) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  double acc = 0.0;
  for (int64_t sp = 0; sp < splits; ++sp) acc += partials[sp * cols + col];
  out[col] = cu::from_acc<T>(static_cast<acc_of<T>>(acc));
}

// Sum over the last dimension: one warp per row, double accumulation.
template <typename T>
__global__ void sum_last_kernel(const T* __restrict__ x, int64_t rows, int64_t n,
                                T* __restrict__ out) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // whole warps leave together (blockDim is a multiple of 32)
  const T* p = x + row * n;
  double acc = 0.0;
  for (int64_t k = lane; k < n; k += 32) acc += static_cast<double>(cu::to_acc(p[k]));
  acc = cu::warp_sum(acc);
  if (lane == 0) out[row] = cu::from_acc<T>(static_cast<acc_of<T>>(acc));
}

// Max (NaN ignored, as std::max(m, v) with m starting at -inf) over the last dim, warp per row.
template <typename T>
__global__ void max_last_kernel(const T* __restrict__ x, int64_t rows, int64_t n,
                                T* __restrict__ out) {
  using A = acc_of<T>;
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* p = x + row * n;
  A m = -INFINITY;
  for (int64_t k = lane; k < n; k += 32) m = fmax(m, cu::to_acc(p[k]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) out[row] = cu::from_acc<T>(m);
}

// First index of the maximum among non-NaN values; 0 when element 0 is NaN (the host loop
// starts from element 0 and `v > m` is false against NaN).
template <typename T>
__global__ void argmax_last_kernel(const T* __restrict__ x, int64_t rows, int64_t n,
                                   int64_t* __restrict__ out) {
  using A = acc_of<T>;
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* p = x + row * n;
  A m = -INFINITY;
  int64_t best = std::numeric_limits<int64_t>::max();
  for (int64_t k = lane; k < n; k += 32) {
    const A v = cu::to_acc(p[k]);
    if (v > m || (v == m && k < best)) {  // NaN compares false: never taken
      m = v;
      best = k;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A om = __shfl_xor_sync(0xffffffffu, m, o);
    const int64_t ob = __shfl_xor_sync(0xffffffffu, best, o);
    if (om > m || (om == m && ob < best)) {
      m = om;
      best = ob;
    }
  }
  if (lane == 0) {
    const A first = cu::to_acc(p[0]);
    out[row] = (isnan(first) || best == std::numeric_limits<int64_t>::max()) ? 0 : best;
  }
}

unsigned warp_rows_blocks(int64_t rows) {
  const int64_t per_block = kThreads / 32;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

// ---------------------------------------------------------------- softmax

// One block per row; f32 (f64) math: max, sum of exp(x - max), then the output.
template <typename T, bool kLog>
__global__ void softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  using A = acc_of<T>;
  __shared__ A scratch[32];
  const int64_t row = blockIdx.x;
  const T* p = x + row * n;
  T* q = y + row * n;
  A m = -INFINITY;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) m = fmax(m, cu::to_acc(p[k]));
  m = cu::warp_max(m);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = m;
  __syncthreads();
  {
    A t = (threadIdx.x & 31) < static_cast<int>(blockDim.x >> 5) ? scratch[threadIdx.x & 31]
                                                                 : A(-INFINITY);
    m = cu::warp_max(t);
  }
  A sum = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) sum += exp(cu::to_acc(p[k]) - m);
  sum = cu::block_sum(sum, scratch);
  if constexpr (kLog) {
    const A lse = m + log(sum);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
      q[k] = cu::from_acc<T>(cu::to_acc(p[k]) - lse);
  } else {
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
      q[k] = cu::from_acc<T>(exp(cu::to_acc(p[k]) - m) / sum);
  }
}

// ---------------------------------------------------------------- index_rows

// out[i, :] = table[ids[i], :], moved as raw words of kBytes; a bad id leaves its row unwritten
// and is reported.
template <typename I, int kBytes>
__global__ void gather_rows_kernel(const void* __restrict__ table, const I* __restrict__ ids,
                                   void* __restrict__ out, int64_t n, int64_t v_rows,
                                   int64_t words_per_row, unsigned long long* first_bad) {
  using R = typename RawOf<kBytes>::type;
  const R* t = static_cast<const R*>(table);
  R* o = static_cast<R*>(out);
  const int64_t total = n * words_per_row;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / words_per_row, w = e % words_per_row;
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= v_rows) {
      if (w == 0) cu::report_bad_index(first_bad, i);
      continue;
    }
    o[e] = t[id * words_per_row + w];
  }
}

}  // namespace

// ================================================================ cuda_ops entry points

void copy(const Tensor& dst, const Tensor& src) {
  LT_CHECK(dst.shape() == src.shape(), "copy: shapes ", shape_str(dst.shape()), " and ",
           shape_str(src.shape()));
  if (dst.numel() == 0) return;
  const bool dc = dst.device().is_cuda(), sc = src.device().is_cuda();
  if (dc && sc) {
    if (dst.device() == src.device())
      same_device_copy(dst, src);
    else
      cross_device_copy(dst, src);
  } else if (dc) {
    host_to_device(dst, src);
  } else if (sc) {
    device_to_host(dst, src);
  } else {
    ops::copy(dst, src);
  }
}

void fill(const Tensor& t, double value) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const Device d = t.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const uint64_t pattern = fill_pattern(t.dtype(), value);
  if (pattern == 0 && t.is_contiguous()) {
    CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), s));
    return;
  }
  const Shape* strides[1] = {&t.strides()};
  const bool contig = t.is_contiguous();
  const Layout L = contig ? Layout{} : coalesce(t.shape(), strides, 1);
  void* p = contig ? t.data_ptr() : base_ptr(t);
  const unsigned blocks = blocks_for(n, d);
  switch (t.element_size()) {
    case 1:
      fill_kernel<1><<<blocks, kThreads, 0, s>>>(p, L, n, pattern, contig);
      break;
    case 2:
      fill_kernel<2><<<blocks, kThreads, 0, s>>>(p, L, n, pattern, contig);
      break;
    case 4:
      fill_kernel<4><<<blocks, kThreads, 0, s>>>(p, L, n, pattern, contig);
      break;
    case 8:
      fill_kernel<8><<<blocks, kThreads, 0, s>>>(p, L, n, pattern, contig);
      break;
    default:
      LT_THROW(ErrorKind::kInternal, "fill: element size ", t.element_size());
  }
  CUDA_CHECK_LAUNCH();
}

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  return binary_out<BinOp::kAdd>(a, b, alpha, "add");
}
void add_(const Tensor& a, const Tensor& b, double alpha) {
  binary_inplace<BinOp::kAdd>(a, b, alpha, "add_");
}
Tensor mul(const Tensor& a, const Tensor& b) { return binary_out<BinOp::kMul>(a, b, 1.0, "mul"); }
void mul_(const Tensor& a, const Tensor& b) { binary_inplace<BinOp::kMul>(a, b, 1.0, "mul_"); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_out<BinOp::kDiv>(a, b, 1.0, "div"); }

Tensor affine(const Tensor& a, double alpha, double beta) {
  return unary_out(a, kUnaryAffine, alpha, beta);
}
void scale_(const Tensor& a, double s) {
  LT_CHECK(a.is_contiguous(), "scale_ on non-contiguous ", a.str());
  unary_launch(a, a, kUnaryScale, s, 0.0);
}
Tensor unary(const Tensor& x, ops::Unary op) { return unary_out(x, static_cast<int>(op), 0, 0); }

Tensor sum(const Tensor& x0) {
  const Device d = x0.device();
  cu::DeviceGuard g(d);
  const DType out_dt = x0.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  LT_CHECK(dtype_is_floating(x0.dtype()), "sum of non-float ", x0.str());
  Tensor out = Tensor::empty({}, out_dt, d, MemTag::kOther);
  if (x0.numel() == 0) {
    fill(out, 0.0);
    return out;
  }
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  Tensor partials = reduce_partials(x, RMode::kSum);
  cudaStream_t s = cu::stream_of(d);
  const int np = static_cast<int>(partials.numel());
  if (out_dt == DType::kF64)
    finalize_sum_kernel<double>
        <<<1, kThreads, 0, s>>>(partials.data<double>(), np, out.data<double>());
  else
    finalize_sum_kernel<float>
        <<<1, kThreads, 0, s>>>(partials.data<double>(), np, out.data<float>());
  CUDA_CHECK_LAUNCH();
  return out;
}

Tensor sum_dim(const Tensor& x0, int64_t dim, bool keepdim) {
  const Device d = x0.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const int64_t nd = x.dim();
  if (dim < 0) dim += nd;
  LT_CHECK(dim >= 0 && dim < nd, "sum_dim: dim out of range for ", x.str());
  int64_t outer = 1, inner = 1;
  const int64_t n = x.shape()[dim];
  for (int64_t i = 0; i < dim; ++i) outer *= x.shape()[i];
  for (int64_t i = dim + 1; i < nd; ++i) inner *= x.shape()[i];
  Shape os = x.shape();
  if (keepdim)
    os[dim] = 1;
  else
    os.erase(os.begin() + dim);
  Tensor out = Tensor::empty(os, x.dtype(), d, current_mem_tag());
  const int64_t cols = outer * inner;
  if (cols == 0) return out;
  if (n == 0) {
    fill(out, 0.0);
    return out;
  }
  LT_CU_DISPATCH_FLOAT(x.dtype(), T, {
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (inner == 1) {
      sum_last_kernel<T><<<warp_rows_blocks(outer), kThreads, 0, s>>>(px, outer, n, po);
      CUDA_CHECK_LAUNCH();
    } else {
      // Enough splits of the reduced dimension to give the device ~8 threads per core slot.
      const int64_t target = static_cast<int64_t>(cu::device_info(d.index).sm_count) * 2048;
      int64_t splits =
          std::clamp<int64_t>(target / std::max<int64_t>(cols, 1), 1, std::max<int64_t>(n / 64, 1));
      const int64_t k_per = (n + splits - 1) / splits;
      splits = (n + k_per - 1) / k_per;
      const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                      static_cast<unsigned>(splits));
      LT_CHECK(splits < 65536, "sum_dim: too many splits");
      if (splits == 1) {
        sum_dim_kernel<T><<<grid, kThreads, 0, s>>>(px, outer, n, inner, k_per, po, nullptr);
        CUDA_CHECK_LAUNCH();
      } else {
        Tensor partials = Tensor::empty({splits, cols}, DType::kF64, d, MemTag::kWorkspace);
        sum_dim_kernel<T>
            <<<grid, kThreads, 0, s>>>(px, outer, n, inner, k_per, po, partials.data<double>());
        CUDA_CHECK_LAUNCH();
        sum_splits_kernel<T>
            <<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads, 0, s>>>(
                partials.data<double>(), splits, cols, po);
        CUDA_CHECK_LAUNCH();
      }
    }
  });
  return out;
}

Tensor max_last(const Tensor& x0) {
  const Device d = x0.device();
  cu::DeviceGuard g(d);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  Shape os(x.shape().begin(), x.shape().end() - 1);
  Tensor out = Tensor::empty(os, x.dtype(), d, current_mem_tag());
  if (rows == 0 || n == 0) return out;
  LT_CU_DISPATCH_FLOAT(x.dtype(), T, {
    max_last_kernel<T><<<warp_rows_blocks(rows), kThreads, 0, cu::stream_of(d)>>>(
        static_cast<const T*>(x.data_ptr()), rows, n, static_cast<T*>(out.data_ptr()));
    CUDA_CHECK_LAUNCH();
  });
  return out;
}

Tensor argmax_last(const Tensor& x0) {
  const Device d = x0.device();
  cu::DeviceGuard g(d);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  Shape os(x.shape().begin(), x.shape().end() - 1);
  Tensor out = Tensor::empty(os, DType::kI64, d, MemTag::kOther);
  if (rows == 0 || n == 0) return out;
  LT_CU_DISPATCH_FLOAT(x.dtype(), T, {
    argmax_last_kernel<T><<<warp_rows_blocks(rows), kThreads, 0, cu::stream_of(d)>>>(
        static_cast<const T*>(x.data_ptr()), rows, n, out.data<int64_t>());
    CUDA_CHECK_LAUNCH();
  });
  return out;
}

double sum_squares(const Tensor& x) { return reduce_to_host(x, RMode::kSumSq); }
double max_abs(const Tensor& x) { return reduce_to_host(x, RMode::kMaxAbs); }
bool all_finite(const Tensor& x) { return reduce_to_host(x, RMode::kNonFinite) == 0.0; }

Tensor softmax_last(const Tensor& x0, bool log) {
  const Device d = x0.device();
  cu::DeviceGuard g(d);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), d, current_mem_tag());
  if (rows == 0 || n == 0) return out;
  LT_CHECK(rows < (int64_t{1} << 31), "softmax_last: too many rows in ", x.str());
  const int threads = n >= 2048 ? 512 : (n >= 256 ? 256 : 128);
  cudaStream_t s = cu::stream_of(d);
  LT_CU_DISPATCH_FLOAT(x.dtype(), T, {
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (log)
      softmax_kernel<T, true><<<static_cast<unsigned>(rows), threads, 0, s>>>(px, po, n);
    else
      softmax_kernel<T, false><<<static_cast<unsigned>(rows), threads, 0, s>>>(px, po, n);
    CUDA_CHECK_LAUNCH();
  });
  return out;
}

Tensor index_rows(const Tensor& table0, const Tensor& ids0) {
  LT_CHECK(table0.dim() == 2 && ids0.dim() == 1, "index_rows: table ", table0.str(), ", ids ",
           ids0.str());
  const Device d = table0.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  Tensor table = contiguous_on_device(table0, current_mem_tag());
  Tensor ids = ids0;
  if (ids.device().is_cpu()) {
    // Host ids: check them here (no device flag and no synchronisation needed).
    Tensor hi = ids.dtype() == DType::kI64 ? ids.contiguous() : ids.to(DType::kI64);
    const int64_t* p = hi.data<int64_t>();
    for (int64_t i = 0; i < hi.numel(); ++i)
      LT_CHECK(p[i] >= 0 && p[i] < table.size(0), "index_rows: id ", p[i], " out of range [0, ",
               table.size(0), ")");
    ids = hi.to(d);
  } else {
    check_same_device(table, ids, "index_rows");
    ids = contiguous_on_device(ids);
  }
  const int64_t n = ids.numel(), h = table.size(1), v = table.size(0);
  Tensor out = Tensor::empty({n, h}, table.dtype(), d, current_mem_tag());
  const int64_t row_bytes = h * static_cast<int64_t>(table.element_size());
  if (n == 0 || row_bytes == 0) return out;
  cu::BadIndexFlag flag(d, s);
  const bool w16 =
      row_bytes % 16 == 0 && cu::aligned16(table.data_ptr()) && cu::aligned16(out.data_ptr());
  const int word = w16 ? 16 : static_cast<int>(table.element_size());
  const int64_t words = row_bytes / word;
  const unsigned blocks = blocks_for(n * words, d);
  LT_CU_DISPATCH_INDEX(ids.dtype(), I, {
    const I* pi = static_cast<const I*>(ids.data_ptr());
    switch (word) {
      case 16:
        gather_rows_kernel<I, 16><<<blocks, kThreads, 0, s>>>(table.data_ptr(), pi, out.data_ptr(),
                                                              n, v, words, flag.ptr());
        break;
      case 1:
        gather_rows_kernel<I, 1><<<blocks, kThreads, 0, s>>>(table.data_ptr(), pi, out.data_ptr(),
                                                             n, v, words, flag.ptr());
        break;
      case 2:
        gather_rows_kernel<I, 2><<<blocks, kThreads, 0, s>>>(table.data_ptr(), pi, out.data_ptr(),
                                                             n, v, words, flag.ptr());
        break;
      case 4:
        gather_rows_kernel<I, 4><<<blocks, kThreads, 0, s>>>(table.data_ptr(), pi, out.data_ptr(),
                                                             n, v, words, flag.ptr());
        break;
      case 8:
        gather_rows_kernel<I, 8><<<blocks, kThreads, 0, s>>>(table.data_ptr(), pi, out.data_ptr(),
                                                             n, v, words, flag.ptr());
        break;
      default:
        LT_THROW(ErrorKind::kInternal, "index_rows: element size ", word);
    }
    CUDA_CHECK_LAUNCH();
  });
  const int64_t bad = flag.first_bad();
  if (bad >= 0) {
    const int64_t id = ids.narrow(0, bad, 1).to_i64()[0];
    LT_THROW(ErrorKind::kInternal, "index_rows: id ", id, " at position ", bad,
             " out of range [0, ", v, ")");
  }
  return out;
}

}  // namespace leantune::cuda_ops

// ================================================================ cuBLASLt / cuBLAS

namespace leantune::cu {
namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;  // NVIDIA's advice for Hopper
constexpr int kMaxDevices = 64;

// Handles live for the whole process: destroying them at static destruction can run after the
// CUDA context is gone.
cublasLtHandle_t lt_handle(int device) {
  static std::mutex mu;
  static cublasLtHandle_t handles[kMaxDevices] = {};
  LT_CHECK(device >= 0 && device < kMaxDevices, "device index ", device);
  std::lock_guard<std::mutex> lk(mu);
  if (!handles[device]) {
    DeviceGuard g(device);
    CUBLAS_CHECK(cublasLtCreate(&handles[device]));
  }
  return handles[device];
}

// The legacy handle (f64 only). Callers hold blas_mutex() while they set stream and workspace
// and run, so that threads sharing the handle do not interleave.
std::mutex& blas_mutex() {
  static std::mutex mu;
  return mu;
}
cublasHandle_t blas_handle(int device) {
  static cublasHandle_t handles[kMaxDevices] = {};
  LT_CHECK(device >= 0 && device < kMaxDevices, "device index ", device);
  if (!handles[device]) {
    DeviceGuard g(device);
    CUBLAS_CHECK(cublasCreate(&handles[device]));
  }
  return handles[device];
}

uint32_t pointer_alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && (v % a) != 0) a >>= 1;
  return a;
}

bool is_64f(const LtGemm& g) { return g.a_type == CUDA_R_64F; }

// Descriptors for one problem, destroyed on scope exit.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void lt_build(const LtGemm& g, LtDescs* x) {
  const bool f64 = is_64f(g);
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&x->op, compute, scale));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (g.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                sizeof(g.bias)));
  }
  // Stored (column-major) shapes of A and B before op().
  const uint64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const uint64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->a, g.a_type, a_rows, a_cols, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->b, g.b_type, b_rows, b_cols, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->d, g.d_type, g.m, g.n, g.ldd));
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&x->pref));
  const uint64_t ws = kLtWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Algorithms that need more alignment than the operands have must be excluded (the default
  // assumes 256-byte aligned buffers).
  const uint32_t al_a = pointer_alignment(g.a), al_b = pointer_alignment(g.b),
                 al_d = pointer_alignment(g.d);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
}

using LtKey = std::array<int64_t, 20>;

LtKey lt_key(const LtGemm& g, int device, int requested) {
  return {device,
          static_cast<int64_t>(g.a_type),
          static_cast<int64_t>(g.b_type),
          static_cast<int64_t>(g.d_type),
          g.trans_a,
          g.trans_b,
          g.m,
          g.n,
          g.k,
          g.lda,
          g.ldb,
          g.ldd,
          g.bias != nullptr,
          pointer_alignment(g.a),
          pointer_alignment(g.b),
          pointer_alignment(g.d),
          g.beta != 0.0,
          requested,
          0,
          0};
}

// One heuristic choice. (A std::vector of cublasLtMatmulHeuristicResult_t itself crashes the
// nvcc 13.0 front end, so the results are copied into this.)
struct LtAlgo {
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
};

// Heuristic results for the problem, best first; cached per key.
std::vector<LtAlgo> lt_heuristics(const LtGemm& g, const LtDescs& x, int device, int requested) {
  static std::mutex mu;
  static std::map<LtKey, std::vector<LtAlgo>> cache;
  const LtKey key = lt_key(g, device, requested);
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  constexpr int kMaxRequested = 64;
  LT_CHECK(requested > 0 && requested <= kMaxRequested, "lt_heuristics: ", requested);
  cublasLtMatmulHeuristicResult_t res[kMaxRequested];
  std::memset(res, 0, sizeof(res));
  int returned = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_handle(device), x.op, x.a, x.b, x.d, x.d, x.pref,
                                              requested, res, &returned));
  std::vector<LtAlgo> algos;
  for (int i = 0; i < returned; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS)
      algos.push_back(LtAlgo{res[i].algo, res[i].workspaceSize});
  std::lock_guard<std::mutex> lk(mu);
  cache.emplace(key, algos);
  return algos;
}

void check_gemm_args(const LtGemm& g) {
  LT_CHECK(g.m > 0 && g.n > 0 && g.k > 0, "gemm: empty problem ", g.m, "x", g.n, "x", g.k);
  LT_CHECK(g.a && g.b && g.d, "gemm: null operand");
  const int64_t a_rows = g.trans_a ? g.k : g.m, b_rows = g.trans_b ? g.n : g.k;
  LT_CHECK(g.lda >= std::max<int64_t>(1, a_rows) && g.ldb >= std::max<int64_t>(1, b_rows) &&
               g.ldd >= std::max<int64_t>(1, g.m),
           "gemm: leading dimensions ", g.lda, ", ", g.ldb, ", ", g.ldd, " too small for ", g.m,
           "x", g.n, "x", g.k);
}

}  // namespace

cudaDataType_t cuda_data_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF64:
      return CUDA_R_64F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      LT_THROW(ErrorKind::kInternal, "no cuBLAS type for ", dtype_name(dt));
  }
}

void lt_gemm(const LtGemm& g, Device dev, cudaStream_t stream, int rank) {
  check_gemm_args(g);
  LT_CHECK(rank >= 0 && rank < 64, "lt_gemm: algorithm rank ", rank);
  DeviceGuard guard(dev);
  LtDescs x;
  lt_build(g, &x);
  const auto res = lt_heuristics(g, x, dev.index, rank + 1);
  LT_CHECK(static_cast<int>(res.size()) > rank, "cuBLASLt has no algorithm (rank ", rank,
           ") for a ", g.m, "x", g.n, "x", g.k, " product of types ", static_cast<int>(g.a_type),
           "/", static_cast<int>(g.b_type), "->", static_cast<int>(g.d_type),
           g.bias ? " with bias" : "");
  const LtAlgo& r = res[static_cast<size_t>(rank)];
  Tensor ws;
  if (r.workspace > 0) ws = workspace(r.workspace, dev);
  const float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  const void* alpha = is_64f(g) ? static_cast<const void*>(&g.alpha) : &alpha_f;
  const void* beta = is_64f(g) ? static_cast<const void*>(&g.beta) : &beta_f;
  CUBLAS_CHECK(cublasLtMatmul(lt_handle(dev.index), x.op, alpha, g.a, x.a, g.b, x.b, beta, g.d, x.d,
                              g.d, x.d, &r.algo, ws.defined() ? ws.data_ptr() : nullptr,
                              r.workspace, stream));
}

int lt_gemm_algo_count(const LtGemm& g, Device dev, int max) {
  check_gemm_args(g);
  DeviceGuard guard(dev);
  LtDescs x;
  lt_build(g, &x);
  return static_cast<int>(lt_heuristics(g, x, dev.index, max).size());
}

void dgemm(const LtGemm& g, Device dev, cudaStream_t stream) {
  check_gemm_args(g);
  LT_CHECK(g.a_type == CUDA_R_64F && g.b_type == CUDA_R_64F && g.d_type == CUDA_R_64F && !g.bias,
           "dgemm: f64 operands only, no bias");
  const int64_t lim = std::numeric_limits<int>::max();
  LT_CHECK(g.m <= lim && g.n <= lim && g.k <= lim && g.lda <= lim && g.ldb <= lim && g.ldd <= lim,
           "dgemm: dimensions exceed cuBLAS's 32-bit range");
  DeviceGuard guard(dev);
  Tensor ws = workspace(kLtWorkspaceBytes, dev);
  std::lock_guard<std::mutex> lk(blas_mutex());
  cublasHandle_t h = blas_handle(dev.index);
  CUBLAS_CHECK(cublasSetStream(h, stream));
  CUBLAS_CHECK(cublasSetWorkspace(h, ws.data_ptr(), kLtWorkspaceBytes));
  CUBLAS_CHECK(cublasDgemm(
      h, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &g.alpha,
      static_cast<const double*>(g.a), static_cast<int>(g.lda), static_cast<const double*>(g.b),
      static_cast<int>(g.ldb), &g.beta, static_cast<double*>(g.d), static_cast<int>(g.ldd)));
}

// ---------------------------------------------------------------- column_sum

namespace {

constexpr int kColX = 32;  // columns per block
constexpr int kColY = 8;   // row lanes per block
constexpr int kFinalizeThreads = 256;

// Block (kColX, kColY) over columns [bx*32, +32) and rows [split*rows_per, +rows_per): lane y
// sums rows y, y+8, ...; the 8 lane sums are added in lane order. One split writes `out`
// directly, several write partials[split][col] (A).
template <typename T, typename O, typename A>
__global__ void column_sum_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld,
                                  int64_t rows_per, O* __restrict__ out, A* __restrict__ partials) {
  __shared__ A tile[kColY][kColX + 1];
  const int64_t col = blockIdx.x * static_cast<int64_t>(kColX) + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per;
  const int64_t r1 = std::min(rows, r0 + rows_per);
  A acc = 0;
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColY) acc += cu::to_acc(x[r * ld + col]);
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    A t = 0;
#pragma unroll
    for (int y = 0; y < kColY; ++y) t += tile[y][threadIdx.x];
    if (partials)
      partials[blockIdx.y * cols + col] = t;
    else
      out[col] = cu::from_acc<O>(t);
  }
}

template <typename A, typename O>
__global__ void column_sum_finalize_kernel(const A* __restrict__ partials, int64_t splits,
                                           int64_t cols, O* __restrict__ out) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  A t = 0;
  for (int64_t s = 0; s < splits; ++s) t += partials[s * cols + col];
  out[col] = cu::from_acc<O>(t);
}

}  // namespace

void column_sum(const void* x, DType x_type, int64_t rows, int64_t cols, int64_t ld, void* out,
                DType out_type, Device dev, cudaStream_t stream) {
  if (cols == 0) return;
  LT_CHECK(ld >= cols, "column_sum: ld ", ld, " < cols ", cols);
  LT_CHECK((x_type == DType::kF64) == (out_type == DType::kF64), "column_sum: output ",
           dtype_name(out_type), " for input ", dtype_name(x_type));
  DeviceGuard guard(dev);
  const int64_t col_blocks = (cols + kColX - 1) / kColX;
  const int64_t target = static_cast<int64_t>(device_info(dev.index).sm_count) * 8;
  // Split the rows when the columns give too few blocks; keep >= 64 rows per split.
  int64_t splits = std::clamp<int64_t>(target / col_blocks, 1, std::max<int64_t>(rows / 64, 1));
  splits = std::min<int64_t>(splits, 65535);
  const int64_t rows_per = std::max<int64_t>((rows + splits - 1) / splits, 1);
  splits = std::max<int64_t>((rows + rows_per - 1) / rows_per, 1);
  const dim3 block(kColX, kColY);
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
  LT_CU_DISPATCH_FLOAT(x_type, T, {
    using A = acc_of<T>;
    LT_CU_DISPATCH_FLOAT(out_type, O, {
      O* o = static_cast<O*>(out);
      if (splits == 1) {
        column_sum_kernel<T, O, A><<<grid, block, 0, stream>>>(static_cast<const T*>(x), rows, cols,
                                                               ld, rows_per, o, nullptr);
        CUDA_CHECK_LAUNCH();
      } else {
        Tensor partials = workspace(static_cast<size_t>(splits * cols) * sizeof(A), dev);
        A* pp = static_cast<A*>(partials.data_ptr());
        column_sum_kernel<T, O, A>
            <<<grid, block, 0, stream>>>(static_cast<const T*>(x), rows, cols, ld, rows_per, o, pp);
        CUDA_CHECK_LAUNCH();
        column_sum_finalize_kernel<A, O>
            <<<static_cast<unsigned>((cols + kFinalizeThreads - 1) / kFinalizeThreads),
               kFinalizeThreads, 0, stream>>>(pp, splits, cols, o);
        CUDA_CHECK_LAUNCH();
      }
    });
  });
}

}  // namespace leantune::cu

// ================================================================ gemm

namespace leantune::cuda_ops {
namespace {

// A 2-D operand as cuBLAS sees a row-major matrix: data, leading dimension, and whether the
// tensor is the transpose of a row-major matrix (then the caller flips its op flag).
struct RowMajor {
  Tensor t;  // keeps a copy alive when one was needed
  const void* ptr = nullptr;
  int64_t ld = 0;
  bool flipped = false;
};

RowMajor as_row_major(const Tensor& x, DType want) {
  RowMajor r;
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t s0 = x.strides()[0], s1 = x.strides()[1];
  if (x.dtype() == want) {
    if ((s1 == 1 || cols == 1) && (rows == 1 || s0 >= cols)) {
      r.t = x;
      r.ptr = x.data_ptr();
      r.ld = rows == 1 ? std::max<int64_t>(cols, 1) : std::max<int64_t>(s0, 1);
      return r;
    }
    if ((s0 == 1 || rows == 1) && (cols == 1 || s1 >= rows)) {
      r.t = x;
      r.ptr = x.data_ptr();
      r.ld = cols == 1 ? std::max<int64_t>(rows, 1) : std::max<int64_t>(s1, 1);
      r.flipped = true;
      return r;
    }
  }
  r.t = Tensor::empty(x.shape(), want, x.device(), MemTag::kWorkspace);
  same_device_copy(r.t, x);
  r.ptr = r.t.data_ptr();
  r.ld = std::max<int64_t>(cols, 1);
  return r;
}

}  // namespace

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta) {
  LT_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "gemm needs 2-D tensors: ", a.str(), ", ",
           b.str(), ", ", c.str());
  const Device d = c.device();
  LT_CHECK(a.device() == d && b.device() == d, "gemm: tensors on different devices");
  const int64_t m = ta ? a.size(1) : a.size(0);
  const int64_t k = ta ? a.size(0) : a.size(1);
  const int64_t n = tb ? b.size(0) : b.size(1);
  LT_CHECK((tb ? b.size(1) : b.size(0)) == k && c.size(0) == m && c.size(1) == n,
           "gemm shapes: ", a.str(), ta ? "^T" : "", " x ", b.str(), tb ? "^T" : "", " -> ",
           c.str());
  if (m == 0 || n == 0) return;
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  if (k == 0) {
    if (beta == 0.0) {
      fill(c, 0.0);
    } else {
      LT_CHECK(c.is_contiguous(), "gemm output must be contiguous: ", c.str());
      scale_(c, beta);
    }
    return;
  }
  const bool c_rows = (c.strides()[1] == 1 || n == 1) && (m == 1 || c.strides()[0] >= n);
  LT_CHECK(c_rows, "gemm output must have unit column stride: ", c.str());
  const int64_t ldc = m == 1 ? n : c.strides()[0];

  auto is16 = [](DType t) { return t == DType::kBF16 || t == DType::kF16; };
  DType in_dt;   // dtype a and b are used in
  Tensor c_f32;  // when c's dtype cannot be the output of the product
  if (a.dtype() == DType::kF64 || b.dtype() == DType::kF64 || c.dtype() == DType::kF64) {
    LT_CHECK(a.dtype() == DType::kF64 && b.dtype() == DType::kF64 && c.dtype() == DType::kF64,
             "gemm: mixed f64 inputs");
    in_dt = DType::kF64;
  } else if (a.dtype() == b.dtype() && is16(a.dtype()) &&
             (c.dtype() == a.dtype() || c.dtype() == DType::kF32)) {
    in_dt = a.dtype();
  } else {
    // Mixed inputs: everything in f32, as the host does.
    in_dt = DType::kF32;
    if (c.dtype() != DType::kF32) {
      c_f32 = Tensor::empty(c.shape(), DType::kF32, d, MemTag::kWorkspace);
      if (beta != 0.0) same_device_copy(c_f32, c);
    }
  }
  const RowMajor ra = as_row_major(a, in_dt), rb = as_row_major(b, in_dt);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's A is our b.
  cu::LtGemm gg;
  gg.a = rb.ptr;
  gg.a_type = cu::cuda_data_type(in_dt);
  gg.lda = rb.ld;
  gg.trans_a = tb != rb.flipped;
  gg.b = ra.ptr;
  gg.b_type = gg.a_type;
  gg.ldb = ra.ld;
  gg.trans_b = ta != ra.flipped;
  gg.d = c_f32.defined() ? c_f32.data_ptr() : c.data_ptr();
  gg.d_type = cu::cuda_data_type(c_f32.defined() ? DType::kF32 : c.dtype());
  gg.ldd = c_f32.defined() ? n : ldc;
  gg.m = n;
  gg.n = m;
  gg.k = k;
  gg.alpha = alpha;
  gg.beta = beta;
  if (in_dt == DType::kF64)
    cu::dgemm(gg, d, s);
  else
    cu::lt_gemm(gg, d, s);
  if (c_f32.defined()) same_device_copy(c, c_f32);
}

}  // namespace leantune::cuda_ops
