// adamw8bit_step_cuda: the 8-bit AdamW step of kernels/optim_8bit.h on the device, operation
// for operation as the CPU step (IEEE-rounded; fused multiply-adds exactly where the contract
// has fma, nothing else contracted), so both agree to the last bit.
//   8-bit parameter: one thread block per 256-element quantization block, one element per
//   thread: decode m and v with the block's absmax, update m, v and the parameter, reduce the
//   new absmax of m and v in shared memory, re-encode (binary search over the 255 f32
//   midpoints of each map, held in shared memory).
//   32-bit parameter (below kOptim8bitMinSize): elementwise, grid-stride.
// param f32/bf16/f16 contiguous; grad any float dtype; states as the header says. One launch
// per parameter (the 8-bit optimizer targets large tensors; small ones are few).
#include <cmath>
#include <type_traits>

#include "engine/cuda_utils.cuh"
#include "kernels/optim_8bit.h"
#include "kernels/quant.h"

namespace leantune::kernels {
namespace {

constexpr int kBlock = static_cast<int>(kOptim8bitBlock);

// The kernels' parameter block: the step's scalars (the CPU path's, kernels/optim_8bit.h), then
// the tensor's own.
struct Consts : AdamScalars {
  float decay;
  int wd;
  int sr;  // stochastic rounding of a bf16 param (kernels/optim_8bit.h)
  unsigned long long seed;
  long long step, offset;
};

// The updated parameter value, as the CPU path's store_param writes it.
template <typename P>
__device__ __forceinline__ P param_out(float w, const Consts& c, int64_t i) {
  if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    if (c.sr)
      return __ushort_as_bfloat16(bf16_stochastic_from_bits32(
          __float_as_uint(w), optim_random_bits(c.seed, c.step, c.offset + i)));
  }
  return cu::from_acc<P>(w);
}

__constant__ float c_map1[256];
__constant__ float c_map2[256];

__device__ __forceinline__ uint8_t code_of(const float* mids, float x) {
  // The number of midpoints strictly below x (lower_bound).
  int lo = 0, hi = 255;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (mids[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return static_cast<uint8_t>(lo);
}

__device__ __forceinline__ float block_max(float x, float* red) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ uint8_t encode(float x, float absmax, bool full, const float* mids) {
  const float clamped = fmaxf(absmax, 1e-38f);
  const float s = full ? __fmul_rn(x, __fdiv_rn(1.0f, clamped)) : __fdiv_rn(x, clamped);
  return code_of(mids, fminf(fmaxf(s, -1.0f), 1.0f));
}

template <typename P, typename G>
__global__ void __launch_bounds__(kBlock) adam8_kernel(P* p, const G* g, uint8_t* q1, uint8_t* q2,
                                                       float* a1, float* a2, int64_t n, Consts c) {
  __shared__ float mid1[255], mid2[255], red[kBlock];
  const int t = threadIdx.x;
  if (t < 255) {
    mid1[t] = __fdiv_rn(__fadd_rn(c_map1[t], c_map1[t + 1]), 2.0f);
    mid2[t] = __fdiv_rn(__fadd_rn(c_map2[t], c_map2[t + 1]), 2.0f);
  }
  const int64_t b = blockIdx.x;
  const int64_t i = b * kBlock + t;
  const bool valid = i < n;
  float m = 0.0f, v = 0.0f;
  if (valid) {
    const float gi = __fmul_rn(static_cast<float>(cu::to_acc(g[i])), c.gs);
    m = __fmul_rn(c_map1[q1[i]], a1[b]);
    v = __fmul_rn(c_map2[q2[i]], a2[b]);
    m = __fmaf_rn(gi, c.omb1, __fmul_rn(m, c.b1));
    v = __fmaf_rn(__fmul_rn(c.omb2, gi), gi, __fmul_rn(v, c.b2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.c2), c.eps);
    float w = cu::to_acc(p[i]);
    if (c.wd) w = __fmul_rn(w, c.decay);
    w = __fadd_rn(w, __fdiv_rn(__fmul_rn(c.step_size, m), denom));
    p[i] = param_out<P>(w, c, i);
  }
  const float am1 = block_max(valid ? fabsf(m) : 0.0f, red);
  const float am2 = block_max(valid ? fabsf(v) : 0.0f, red);
  const bool full = (b + 1) * kBlock <= n;
  if (valid) {
    q1[i] = encode(m, am1, full, mid1);
    q2[i] = encode(v, am2, full, mid2);
  }
  if (t == 0) {
    a1[b] = full ? am1 : fmaxf(am1, 1e-38f);
    a2[b] = full ? am2 : fmaxf(am2, 1e-38f);
  }
}

template <typename P, typename G>
__global__ void adam32_kernel(P* p, const G* g, float* m, float* v, int64_t n, Consts c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = __fmul_rn(static_cast<float>(cu::to_acc(g[i])), c.gs);
    const float mi = __fmaf_rn(gi, c.omb1, __fmul_rn(m[i], c.b1));
    const float vi = __fmaf_rn(__fmul_rn(c.omb2, gi), gi, __fmul_rn(v[i], c.b2));
    m[i] = mi;
    v[i] = vi;
    float w = cu::to_acc(p[i]);
    if (c.wd) w = __fmul_rn(w, c.decay);
    w = __fmaf_rn(__fdiv_rn(mi, __fadd_rn(__fsqrt_rn(vi), c.eps_c2)), c.step_size32, w);
    p[i] = param_out<P>(w, c, i);
  }
}

void check_tensor(const Adam8Tensor& t, Device d) {
  const char* op = "adamw8bit_step_cuda";
  cu::check_operand(t.param, d, op, "param");
  cu::check_operand(t.grad, d, op, "grad");
  cu::check_operand(t.state1, d, op, "state1");
  cu::check_operand(t.state2, d, op, "state2");
  const int64_t n = t.param.numel();
  LT_CHECK(t.param.dtype() == DType::kF32 || t.param.dtype() == DType::kBF16 ||
               t.param.dtype() == DType::kF16,
           op, ": param ", t.param.str());
  LT_CHECK(dtype_is_floating(t.grad.dtype()) && t.grad.numel() == n, op, ": grad ", t.grad.str(),
           " for param ", t.param.str());
  const bool q = t.absmax1.defined();
  const DType sdt = q ? DType::kU8 : DType::kF32;
  cu::check_dtype(t.state1, sdt, op, "state1");
  cu::check_dtype(t.state2, sdt, op, "state2");
  LT_CHECK(t.state1.numel() == n && t.state2.numel() == n, op, ": states ", t.state1.str(),
           " for param ", t.param.str());
  if (q) {
    cu::check_operand(t.absmax1, d, op, "absmax1");
    cu::check_operand(t.absmax2, d, op, "absmax2");
    cu::check_dtype(t.absmax1, DType::kF32, op, "absmax1");
    cu::check_dtype(t.absmax2, DType::kF32, op, "absmax2");
    const int64_t blocks = (n + kOptim8bitBlock - 1) / kOptim8bitBlock;
    LT_CHECK(t.absmax1.numel() == blocks && t.absmax2.numel() == blocks, op, ": absmax ",
             t.absmax1.str(), " for param ", t.param.str());
  }
}

}  // namespace

void adamw8bit_step_cuda(const std::vector<Adam8Tensor>& tensors, const AdamWStepArgs& a) {
  if (tensors.empty()) return;
  const Device d = tensors[0].param.device();
  LT_CHECK(d.is_cuda(), "adamw8bit_step_cuda: param ", tensors[0].param.str(), " is on the host");
  for (const Adam8Tensor& t : tensors) check_tensor(t, d);
  LT_CHECK(a.step >= 1, "adamw8bit_step_cuda: step ", a.step, " (1-based)");
  cu::DeviceGuard guard(d);
  cudaStream_t stream = cu::stream_of(d);
  CUDA_CHECK(cudaMemcpyToSymbolAsync(c_map1, kDynamicMap, sizeof(float) * 256, 0,
                                     cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyToSymbolAsync(c_map2, kDynamicMapUnsigned, sizeof(float) * 256, 0,
                                     cudaMemcpyHostToDevice, stream));
  const AdamScalars scalars = adam_scalars(a);
  for (const Adam8Tensor& t : tensors) {
    const int64_t n = t.param.numel();
    if (n == 0) continue;
    const Consts c{scalars,
                   static_cast<float>(1.0 - a.lr * t.weight_decay),
                   t.weight_decay > 0.0 ? 1 : 0,
                   t.stochastic_round ? 1 : 0,
                   static_cast<unsigned long long>(t.seed),
                   static_cast<long long>(a.step),
                   static_cast<long long>(t.index_offset)};
    LT_CU_DISPATCH_F32_16(t.param.dtype(), P, {
      LT_CU_DISPATCH_FLOAT(t.grad.dtype(), G, {
        P* p = static_cast<P*>(t.param.data_ptr());
        const G* g = static_cast<const G*>(t.grad.data_ptr());
        if (t.absmax1.defined()) {
          const int64_t blocks = (n + kOptim8bitBlock - 1) / kOptim8bitBlock;
          LT_CHECK(blocks < (int64_t{1} << 31), "adamw8bit_step_cuda: too large ", t.param.str());
          adam8_kernel<P, G><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
              p, g, t.state1.data<uint8_t>(), t.state2.data<uint8_t>(), t.absmax1.data<float>(),
              t.absmax2.data<float>(), n, c);
        } else {
          const int64_t grid = std::min<int64_t>((n + 255) / 256, 4096);
          adam32_kernel<P, G><<<static_cast<unsigned>(grid), 256, 0, stream>>>(
              p, g, t.state1.data<float>(), t.state2.data<float>(), n, c);
        }
        CUDA_CHECK_LAUNCH();
      });
    });
  }
}

}  // namespace leantune::kernels
