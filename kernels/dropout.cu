// dropout on CUDA: y = x * keep / (1 - p) (kernels/dropout.h), forward and backward alike.
// The mask is bit-identical to the host's and to bernoulli_(.., 1 - p) from the same generator
// offset: element i uses Philox block (offset + i/4) and word i%4 of it (engine/philox.h), and
// keep = philox_uniform(word) < float(1 - p). Each thread computes one block and its (up to) 4
// elements, grid-stride, as engine/rng.cu does. The product with the f32 (f64 for f64) scale is
// an explicit __fmul_rn/__dmul_rn, one rounding to the output dtype, as on the host.
// x and y are contiguous (the host entry point copies strided inputs); y may alias x.
#include "engine/cuda_utils.cuh"
#include "kernels/cuda_device.cuh"
#include "kernels/dropout.h"

namespace leantune::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, PhiloxParams p, float keep_below,
                               cu::acc_of<T> scale) {
  using A = cu::acc_of<T>;
  const int64_t blocks = (n + 3) / 4;
  for (int64_t blk = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; blk < blocks;
       blk += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxBlock r = philox_block(p, static_cast<uint64_t>(blk));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = blk * 4 + j;
      if (i >= n) break;
      const bool keep = philox_uniform(r.w[j]) < keep_below;
      y[i] = cu::from_acc<T>(keep ? cu::mul_rn(cu::to_acc(x[i]), scale) : A(0));
    }
  }
}

}  // namespace

void dropout_apply_cuda(const Tensor& x, const Tensor& y, double p, const PhiloxParams& params) {
  const char* op = "dropout_apply_cuda";
  const Device d = cuda_device_of(y, op, "y");
  cu::check_operand(x, d, op, "x");
  cu::check_contiguous(y, op, "y");
  LT_CHECK(x.shape() == y.shape() && x.dtype() == y.dtype() && dtype_is_floating(x.dtype()), op,
           ": x ", x.str(), ", y ", y.str());
  LT_CHECK(p >= 0.0 && p <= 1.0, op, ": probability ", p, " outside [0, 1]");
  const int64_t n = y.numel();
  cu::check_index_range(n, op);
  if (n == 0) return;
  cu::DeviceGuard g(d);
  const unsigned grid = cu::grid_blocks((n + 3) / 4, kThreads, d.index);
  const float keep_below = static_cast<float>(1.0 - p);
  const double inv_keep = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  LT_CU_DISPATCH_FLOAT(y.dtype(), T, {
    using A = cu::acc_of<T>;
    dropout_kernel<T><<<grid, kThreads, 0, cu::stream_of(d)>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), n, params, keep_below,
        static_cast<A>(inv_keep));
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace leantune::kernels
