// Device helpers the CUDA kernels share, in the accumulation type A (float for f32/bf16/f16,
// double for f64): libm's exp, log, tanh and sincos at A's precision (expf for float, exp for
// double, ...), the correctly rounded division and square root (the CPU path's IEEE results,
// never contracted), and N elements of T loaded into / stored from A (one 16-byte access when
// N > 1, else a scalar).
#pragma once

#include <cmath>

#include "engine/cuda_utils.cuh"

namespace leantune::kernels {

__device__ __forceinline__ float libm_exp(float x) { return expf(x); }
__device__ __forceinline__ double libm_exp(double x) { return exp(x); }
__device__ __forceinline__ float libm_log(float x) { return logf(x); }
__device__ __forceinline__ double libm_log(double x) { return log(x); }
__device__ __forceinline__ float libm_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double libm_tanh(double x) { return tanh(x); }
__device__ __forceinline__ void libm_sincos(float x, float* s, float* c) { sincosf(x, s, c); }
__device__ __forceinline__ void libm_sincos(double x, double* s, double* c) { sincos(x, s, c); }

// 2^x by the SFU alone: ex2.approx.ftz.f32 (2 ulp over the normal range, as exp2f; -inf -> 0).
// Results below 2^-126 flush to 0 where exp2f keeps them as denormals at the cost of a compare
// and two predicated multiplies per call: 3 of the ~9 instructions per element of the
// issue-bound softmax passes (cross entropy, attention), for values no sum of terms including
// the row's largest (2^0) and no bf16/f16 probability can tell from 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }

template <typename T, int N, typename A>
__device__ __forceinline__ void load_n(const T* p, A (&x)[N]) {
  if constexpr (N > 1)
    cu::load_vec<T, N>(p, x);
  else
    x[0] = cu::to_acc(p[0]);
}
template <typename T, int N, typename A>
__device__ __forceinline__ void store_n(T* p, const A (&x)[N]) {
  if constexpr (N > 1)
    cu::store_vec<T, N>(p, x);
  else
    p[0] = cu::from_acc<T>(x[0]);
}

}  // namespace leantune::kernels
