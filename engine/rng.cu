// cuda_ops::philox_fill: random fills of float tensors on the device, bit-identical to the host
// fill in engine/rng.cpp.
//
// Element i of a draw uses Philox block (offset + i/4) and word i%4 of it (engine/philox.h).
// Each thread computes one block and writes its (up to) 4 elements. The value is the host's
// philox_fill_value, in double with __dadd_rn/__dmul_rn so that no FMA contraction changes a
// rounding (the host file is compiled with -ffp-contract=off for the same reason):
//   uniform:   v = a + (b - a) * u             u = philox_uniform(word)
//   normal:    v = a + b * z                   z = philox_normal(block, i%4)
//   bernoulli: v = u < float(a) ? 1 : 0
// then v is rounded to the tensor's dtype (double -> float -> bf16/f16, nearest even), as
// cpu::from_double does. t must be contiguous (f32, f64, bf16 or f16).
#include "engine/cuda_utils.cuh"
#include "engine/rng.h"

namespace leantune::cuda_ops {
namespace {

template <typename T>
__device__ __forceinline__ T from_double_rn(double v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    const float f = __double2float_rn(v);
    return cu::from_acc<T>(f);
  }
}

template <typename T>
__global__ void philox_fill_kernel(T* __restrict__ out, int64_t n, PhiloxParams p, int kind,
                                   double a, double b_minus_a, double b) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t blk = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; blk < blocks;
       blk += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxBlock r = philox_block(p, static_cast<uint64_t>(blk));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = blk * 4 + j;
      if (i >= n) break;
      const double v = philox_fill_value(r, j, kind, a, b_minus_a, b);
      out[i] = from_double_rn<T>(v);
    }
  }
}

}  // namespace

void philox_fill(const Tensor& t, const PhiloxParams& p, int kind, double a, double b) {
  LT_CHECK(t.device().is_cuda(), "philox_fill of host tensor ", t.str());
  LT_CHECK(t.is_contiguous(), "random fill of non-contiguous ", t.str());
  LT_CHECK(kind >= 0 && kind <= 2, "philox_fill: kind ", kind);
  const int64_t n = t.numel();
  if (n == 0) return;
  const Device d = t.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  constexpr int kThreads = 256;
  const unsigned grid = cu::grid_blocks((n + 3) / 4, kThreads, d.index);
  // (b - a) is formed once here; the host forms the same double per element.
  const double b_minus_a = b - a;
  LT_CU_DISPATCH_FLOAT(t.dtype(), T, {
    philox_fill_kernel<T>
        <<<grid, kThreads, 0, s>>>(static_cast<T*>(t.data_ptr()), n, p, kind, a, b_minus_a, b);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace leantune::cuda_ops
