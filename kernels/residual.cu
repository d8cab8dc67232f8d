// residual_add on CUDA: y = a + b
//   a, b, y: same shape and float dtype (f32, bf16, f16, f64); the sum is formed in f32 (f64 for
//   f64) and rounded once, as the CPU path does. y may alias a or b (elementwise).
//   Strided a or b are copied to contiguous scratch first; y must be contiguous.
// One pass: 16-byte loads of a and b, 16-byte stores of y, grid-stride.
#include "engine/cuda_utils.cuh"
#include "kernels/cuda_device.cuh"
#include "kernels/residual.h"

namespace leantune::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T, int N>
__global__ void residual_add_fwd_kernel(const T* a, const T* b, T* y, int64_t n) {
  using A = cu::acc_of<T>;
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t v = tid; v < nvec; v += stride) {
    A x[N], z[N];
    cu::load_vec<T, N>(a + v * N, x);
    cu::load_vec<T, N>(b + v * N, z);
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] = cu::add_rn(x[j], z[j]);
    cu::store_vec<T, N>(y + v * N, x);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride)
    y[i] = cu::from_acc<T>(cu::add_rn(cu::to_acc(a[i]), cu::to_acc(b[i])));
}

void residual_add_fwd_launch(const void* a, const void* b, void* y, int64_t n, DType dt, int device,
                             cudaStream_t stream) {
  if (n == 0) return;
  LT_CU_DISPATCH_FLOAT(dt, T, {
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = cu::aligned16(a) && cu::aligned16(b) && cu::aligned16(y);
    const unsigned blocks = cu::grid_blocks(vec ? (n + kVec - 1) / kVec : n, kThreads, device);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* py = static_cast<T*>(y);
    if (vec)
      residual_add_fwd_kernel<T, kVec><<<blocks, kThreads, 0, stream>>>(pa, pb, py, n);
    else
      residual_add_fwd_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(pa, pb, py, n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void residual_add_fwd_cuda(const Tensor& a, const Tensor& b, const Tensor& y) {
  const char* op = "residual_add_fwd_cuda";
  const Device d = cuda_device_of(y, op, "y");
  cu::check_on(a, d, op, "a");
  cu::check_on(b, d, op, "b");
  cu::check_contiguous(y, op, "y");
  LT_CHECK(a.shape() == b.shape() && a.shape() == y.shape() && a.dtype() == b.dtype() &&
               a.dtype() == y.dtype() && dtype_is_floating(a.dtype()),
           op, ": a ", a.str(), ", b ", b.str(), ", y ", y.str());
  cu::DeviceGuard g(d);
  const Tensor ac = cu::contiguous_ws(a), bc = cu::contiguous_ws(b);
  residual_add_fwd_launch(ac.data_ptr(), bc.data_ptr(), y.data_ptr(), y.numel(), y.dtype(), d.index,
                          cu::stream_of(d));
}

}  // namespace leantune::kernels
