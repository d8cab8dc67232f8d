// CUDA reductions: full sums (deterministic f64 partials), sum over a dimension, max/argmax over
// the last one, and the host scalars sum_squares/max_abs/all_finite (contract in
// engine/ops_cuda_internal.cuh).
#include "engine/ops_cuda_internal.cuh"

namespace leantune::cuda_ops {
namespace {

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

}  // namespace

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
  const ops::DimReduction r = ops::dim_reduction(x, dim, keepdim, "sum_dim");
  const int64_t outer = r.outer, n = r.n, inner = r.inner;
  Tensor out = Tensor::empty(r.shape, x.dtype(), d, current_mem_tag());
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

namespace {

// max_last and argmax_last: x (made contiguous) as [rows, n], one warp per row;
// launch(px, rows, n, out, stream) starts the kernel for px's element type. The output, of
// out_dt, drops x's last dimension.
template <typename Launch>
Tensor last_dim_reduce(const Tensor& x0, DType out_dt, MemTag tag, Launch launch) {
  const Device d = x0.device();
  cu::DeviceGuard g(d);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const ops::LastDimRows last = ops::last_dim_rows(x);
  Tensor out = Tensor::empty(last.shape, out_dt, d, tag);
  if (last.rows == 0 || last.n == 0) return out;
  LT_CU_DISPATCH_FLOAT(x.dtype(), T, {
    launch(static_cast<const T*>(x.data_ptr()), last.rows, last.n, out, cu::stream_of(d));
    CUDA_CHECK_LAUNCH();
  });
  return out;
}

}  // namespace

Tensor max_last(const Tensor& x0) {
  return last_dim_reduce(
      x0, x0.dtype(), current_mem_tag(),
      [](const auto* px, int64_t rows, int64_t n, const Tensor& out, cudaStream_t s) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(px)>>;
        max_last_kernel<T><<<warp_rows_blocks(rows), kThreads, 0, s>>>(
            px, rows, n, static_cast<T*>(out.data_ptr()));
      });
}

Tensor argmax_last(const Tensor& x0) {
  return last_dim_reduce(
      x0, DType::kI64, MemTag::kOther,
      [](const auto* px, int64_t rows, int64_t n, const Tensor& out, cudaStream_t s) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(px)>>;
        argmax_last_kernel<T>
            <<<warp_rows_blocks(rows), kThreads, 0, s>>>(px, rows, n, out.data<int64_t>());
      });
}

double sum_squares(const Tensor& x) { return reduce_to_host(x, RMode::kSumSq); }
double max_abs(const Tensor& x) { return reduce_to_host(x, RMode::kMaxAbs); }
bool all_finite(const Tensor& x) { return reduce_to_host(x, RMode::kNonFinite) == 0.0; }

}  // namespace leantune::cuda_ops
