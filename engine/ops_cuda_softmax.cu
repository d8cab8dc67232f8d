// CUDA softmax and log-softmax over the last dimension (contract in
// engine/ops_cuda_internal.cuh).
#include "engine/ops_cuda_internal.cuh"

namespace leantune::cuda_ops {
namespace {

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

}  // namespace

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

}  // namespace leantune::cuda_ops
