// divergence_blocks on CUDA: see the header.
//   zs, zt:[c,nb] f32|f64, stats:[c,kDivStats] and rowtab:[c,4] of zs's dtype A; dz:[c,nb] A or
//   bf16 (A = f32), may alias zs.
// One block of threads per row. The statistics pass reads the row twice (the block's maxima of
// both models, then the five sums relative to the merged maxima, so no per-thread rescaling);
// thread 0 merges the block into the row's running statistics. The JSD pass reads the row once
// and adds its two sums; the gradient reads each element and writes it once (the same thread, so
// dz may alias zs). exp, log and tanh are libm's at A's precision: the divergence of two close
// distributions is a small difference of large sums, so no fast approximations here.
// Scratch: 5 x 32 A of shared memory per block.
#include <cuda_bf16.h>

#include <type_traits>

#include "engine/cuda_utils.cuh"
#include "kernels/acc_math.cuh"
#include "kernels/divergence_blocks.h"

namespace leantune::kernels {
namespace {

template <typename A>
__device__ __forceinline__ A capped(A y, A cap, A inv_t) {
  return (cap > A(0) ? cap * libm_tanh(y / cap) : y) * inv_t;
}

template <bool Max, typename A>
__device__ __forceinline__ A warp_reduce(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A other = __shfl_xor_sync(0xffffffffu, v, o);
    v = Max ? fmax(v, other) : v + other;
  }
  return v;
}

// Reduces W values over the block (blockDim.x a multiple of 32); every thread gets the results.
// sh: W x 32 A of shared memory, free again on return.
template <bool Max, int W, typename A>
__device__ __forceinline__ void block_reduce(A (&v)[W], A* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const A none = Max ? A(-INFINITY) : A(0);
#pragma unroll
  for (int w = 0; w < W; ++w) v[w] = warp_reduce<Max>(v[w]);
  if (lane == 0)
#pragma unroll
    for (int w = 0; w < W; ++w) sh[w * 32 + warp] = v[w];
  __syncthreads();
#pragma unroll
  for (int w = 0; w < W; ++w) v[w] = warp_reduce<Max>(lane < warps ? sh[w * 32 + lane] : none);
  __syncthreads();
}

template <typename A>
__global__ void stats_kernel(const A* __restrict__ zs, const A* __restrict__ zt, int64_t nb,
                             A inv_t, A scap, A tcap, A* __restrict__ stats) {
  __shared__ A sh[5 * 32];
  const A* a = zs + blockIdx.x * nb;
  const A* b = zt + blockIdx.x * nb;
  A* r = stats + blockIdx.x * static_cast<int64_t>(kDivStats);
  A m[2] = {A(-INFINITY), A(-INFINITY)};
  for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) {
    m[0] = fmax(m[0], capped(a[j], scap, inv_t));
    m[1] = fmax(m[1], capped(b[j], tcap, inv_t));
  }
  block_reduce<true>(m, sh);
  const A old_s = r[kSMax], old_t = r[kTMax];
  const A sm = fmax(old_s, m[0]), tm = fmax(old_t, m[1]);
  A acc[5] = {A(0), A(0), A(0), A(0), A(0)};  // s_sum, s_zsum, s_gap, t_sum, t_gap
  for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) {
    const A x = capped(a[j], scap, inv_t), y = capped(b[j], tcap, inv_t);
    const A es = libm_exp(x - sm), et = libm_exp(y - tm);
    acc[0] += es;
    acc[1] += es * x;
    acc[2] += es * (x - y);
    acc[3] += et;
    acc[4] += et * (y - x);
  }
  block_reduce<false>(acc, sh);
  if (threadIdx.x != 0) return;
  const A sr = old_s == A(-INFINITY) ? A(0) : libm_exp(old_s - sm);
  const A tr = old_t == A(-INFINITY) ? A(0) : libm_exp(old_t - tm);
  r[kSSum] = r[kSSum] * sr + acc[0];
  r[kSZSum] = r[kSZSum] * sr + acc[1];
  r[kSGap] = r[kSGap] * sr + acc[2];
  r[kTSum] = r[kTSum] * tr + acc[3];
  r[kTGap] = r[kTGap] * tr + acc[4];
  r[kSMax] = sm;
  r[kTMax] = tm;
}

template <typename A>
__device__ __forceinline__ A log_mixture(A lps, A lpt, A log_1mb, A log_b) {
  const A x = lps + log_1mb, y = lpt + log_b;
  const A top = fmax(x, y);
  return top + libm_log(libm_exp(x - top) + libm_exp(y - top));
}

template <typename A>
__global__ void jsd_kernel(const A* __restrict__ zs, const A* __restrict__ zt, int64_t nb, A inv_t,
                           A scap, A tcap, A beta, A* __restrict__ stats) {
  __shared__ A sh[2 * 32];
  const A* a = zs + blockIdx.x * nb;
  const A* b = zt + blockIdx.x * nb;
  A* r = stats + blockIdx.x * static_cast<int64_t>(kDivStats);
  const A s_logz = r[kSMax] + libm_log(r[kSSum]), t_logz = r[kTMax] + libm_log(r[kTSum]);
  const A log_1mb = libm_log(A(1) - beta), log_b = libm_log(beta);
  A acc[2] = {A(0), A(0)};  // jsd, KL(p_s || m)
  for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) {
    const A lps = capped(a[j], scap, inv_t) - s_logz, lpt = capped(b[j], tcap, inv_t) - t_logz;
    const A lm = log_mixture(lps, lpt, log_1mb, log_b);
    const A k = libm_exp(lps) * (lps - lm);
    acc[0] += beta * libm_exp(lpt) * (lpt - lm) + (A(1) - beta) * k;
    acc[1] += k;
  }
  block_reduce<false>(acc, sh);
  if (threadIdx.x != 0) return;
  r[kJsd] += acc[0];
  r[kKlS] += acc[1];
}

template <typename A, typename D>
__global__ void grad_kernel(const A* zs, const A* __restrict__ zt, int64_t nb, A inv_t, A scap,
                            A tcap, A beta, int mode, const A* __restrict__ rowtab, D* dz) {
  const int64_t base = blockIdx.x * nb;
  const A* t = rowtab + blockIdx.x * int64_t{4};
  const A s_logz = t[0], t_logz = t[1], aux = t[2], scale = t[3];
  const A log_1mb = mode == 2 ? libm_log(A(1) - beta) : A(0);
  const A log_b = mode == 2 ? libm_log(beta) : A(0);
  for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) {
    const A y = zs[base + j];
    const A th = scap > A(0) ? libm_tanh(y / scap) : A(0);
    const A lps = (scap > A(0) ? scap * th : y) * inv_t - s_logz;
    const A lpt = capped(zt[base + j], tcap, inv_t) - t_logz;
    const A ps = libm_exp(lps);
    A g = mode == 0   ? ps - libm_exp(lpt)
          : mode == 1 ? ps * (lps - lpt - aux)
                      : (A(1) - beta) * ps * (lps - log_mixture(lps, lpt, log_1mb, log_b) - aux);
    g *= scale;
    if (scap > A(0)) g *= A(1) - th * th;
    if constexpr (std::is_same_v<D, __nv_bfloat16>)
      dz[base + j] = __float2bfloat16(static_cast<float>(g));
    else
      dz[base + j] = static_cast<D>(g);
  }
}

int threads_for(int64_t nb) { return nb >= 4096 ? 512 : nb >= 512 ? 256 : 128; }

struct Launch {
  unsigned rows;
  int threads;
  cudaStream_t stream;
};

Launch launch_of(const Tensor& zs, const char* op) {
  LT_CHECK(zs.size(0) < (int64_t{1} << 31), op, ": too many rows (", zs.size(0), ")");
  return {static_cast<unsigned>(zs.size(0)), threads_for(zs.size(1)), cu::stream_of(zs.device())};
}

template <typename A>
void stats_launch(const A* zs, const A* zt, int64_t nb, const DivergenceBlockParams& p, A* stats,
                  const Launch& l) {
  stats_kernel<A><<<l.rows, l.threads, 0, l.stream>>>(zs, zt, nb, A(p.inv_t), A(p.student_softcap),
                                                      A(p.teacher_softcap), stats);
  CUDA_CHECK_LAUNCH();
}

template <typename A>
void jsd_launch(const A* zs, const A* zt, int64_t nb, const DivergenceBlockParams& p, A* stats,
                const Launch& l) {
  jsd_kernel<A><<<l.rows, l.threads, 0, l.stream>>>(zs, zt, nb, A(p.inv_t), A(p.student_softcap),
                                                    A(p.teacher_softcap), A(p.beta), stats);
  CUDA_CHECK_LAUNCH();
}

template <typename A, typename D>
void grad_launch(const A* zs, const A* zt, int64_t nb, const DivergenceBlockParams& p,
                 const A* rowtab, D* dz, const Launch& l) {
  const int mode = p.beta == 0 ? 0 : p.beta == 1 ? 1 : 2;
  grad_kernel<A, D><<<l.rows, l.threads, 0, l.stream>>>(zs, zt, nb, A(p.inv_t),
                                                        A(p.student_softcap), A(p.teacher_softcap),
                                                        A(p.beta), mode, rowtab, dz);
  CUDA_CHECK_LAUNCH();
}

// The operands' devices and layouts (their shapes and dtypes were checked by the dispatcher).
void check_cuda(const char* op, const Tensor& zs, const Tensor& zt, const Tensor& table) {
  const Device d = zs.device();
  LT_CHECK(d.is_cuda(), op, ": zs ", zs.str(), " is not on a CUDA device");
  cu::check_operand(zs, d, op, "zs");
  cu::check_operand(zt, d, op, "zt");
  cu::check_operand(table, d, op, "row table");
  cu::check_index_range(zs.numel(), op);
}

}  // namespace

void divergence_block_stats_cuda(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                                 const Tensor& stats) {
  const char* op = "divergence_block_stats";
  check_cuda(op, zs, zt, stats);
  if (zs.numel() == 0) return;
  cu::DeviceGuard g(zs.device());
  const Launch l = launch_of(zs, op);
  if (zs.dtype() == DType::kF64)
    stats_launch(zs.data<double>(), zt.data<double>(), zs.size(1), p, stats.data<double>(), l);
  else
    stats_launch(zs.data<float>(), zt.data<float>(), zs.size(1), p, stats.data<float>(), l);
}

void divergence_block_jsd_cuda(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                               const Tensor& stats) {
  const char* op = "divergence_block_jsd";
  check_cuda(op, zs, zt, stats);
  if (zs.numel() == 0) return;
  cu::DeviceGuard g(zs.device());
  const Launch l = launch_of(zs, op);
  if (zs.dtype() == DType::kF64)
    jsd_launch(zs.data<double>(), zt.data<double>(), zs.size(1), p, stats.data<double>(), l);
  else
    jsd_launch(zs.data<float>(), zt.data<float>(), zs.size(1), p, stats.data<float>(), l);
}

void divergence_block_grad_cuda(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                                const Tensor& rowtab, const Tensor& dz) {
  const char* op = "divergence_block_grad";
  check_cuda(op, zs, zt, rowtab);
  cu::check_operand(dz, zs.device(), op, "dz");
  if (zs.numel() == 0) return;
  cu::DeviceGuard g(zs.device());
  const Launch l = launch_of(zs, op);
  const int64_t nb = zs.size(1);
  if (zs.dtype() == DType::kF64)
    grad_launch(zs.data<double>(), zt.data<double>(), nb, p, rowtab.data<double>(),
                dz.data<double>(), l);
  else if (dz.dtype() == DType::kBF16)
    grad_launch(zs.data<float>(), zt.data<float>(), nb, p, rowtab.data<float>(),
                static_cast<__nv_bfloat16*>(dz.data_ptr()), l);
  else
    grad_launch(zs.data<float>(), zt.data<float>(), nb, p, rowtab.data<float>(), dz.data<float>(),
                l);
}

}  // namespace leantune::kernels
