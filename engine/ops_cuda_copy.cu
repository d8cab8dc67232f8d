// CUDA copy and fill (contract in engine/ops_cuda_internal.cuh): strided same-device copies as
// raw element words, f32/bf16/f16 conversions, host<->device and cross-device transfers.
#include "engine/ops_cuda_internal.cuh"

namespace leantune::cuda_ops {
namespace {

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

// Strided element base pointer: the storage start plus the tensor's offset.
void* base_ptr(const Tensor& t) {
  (void)t.data_ptr();  // Errors for released memory
  return static_cast<char*>(t.storage()->data()) +
         t.offset() * static_cast<int64_t>(t.element_size());
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

}  // namespace

namespace detail {

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

Tensor contiguous_on_device(const Tensor& t, MemTag tag) {
  if (t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device(), tag);
  same_device_copy(out, t);
  return out;
}

}  // namespace detail

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

}  // namespace leantune::cuda_ops
