// The one-pass log-sum-exp of a row that cross_entropy and linear_cross_entropy share on CUDA.
//   z:[v] (f32, bf16, f16, f64) read once -> lse = m + log(sum_j exp(z_j - m)), m = max_j z_j,
//   in the accumulation type A (f32; f64 for f64). A row of -inf (or an empty row) gives NaN, as
//   the CPU path's formula does.
// Each thread keeps an online (max, sum) over its N-wide vectors (N = 1 when the row is not
// 16-byte aligned); merging two states rescales the sums by exp(m_a - m_b), so the result equals
// the two-pass formula up to rounding. exp is 2^(x log2 e) in f32 (exp2_ftz: the ex2 unit and
// one multiply, a few ulps; few instructions per logit keep the pass memory-bound).
// Scratch: 2 x 32 A of shared memory, passed in by the caller.
#pragma once

#include <cmath>
#include <type_traits>

#include "engine/cuda_utils.cuh"
#include "kernels/acc_math.cuh"

namespace leantune::kernels::online {

template <typename A>
__device__ __forceinline__ A exp_acc(A v) {
  if constexpr (std::is_same_v<A, float>)
    return exp2_ftz(v * 1.4426950408889634f);
  else
    return exp(v);
}

template <typename A>
struct State {
  A m;
  A s;
};

template <typename A>
__device__ __forceinline__ State<A> merge(State<A> a, State<A> b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const A m = fmax(a.m, b.m);
  return {m, a.s * exp_acc(a.m - m) + b.s * exp_acc(b.m - m)};
}

// Adds N values to the running state. Values equal to -inf add exp(-inf) = 0 and are skipped,
// so a leading run of -inf cannot turn the state into NaN (no -inf - -inf).
template <typename A, int N>
__device__ __forceinline__ void add(State<A>& st, const A (&v)[N]) {
  A vm = v[0];
#pragma unroll
  for (int j = 1; j < N; ++j) vm = fmax(vm, v[j]);
  if (vm == -INFINITY) return;
  if (vm > st.m) {
    st.s = st.m == -INFINITY ? A(0) : st.s * exp_acc(st.m - vm);
    st.m = vm;
  }
  A sum = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) sum += exp_acc(v[j] - st.m);
  st.s += sum;
}

// The log-sum-exp of z[0, v) by the whole block (blockDim.x a multiple of 32, at most 1024).
// Every thread must call it; the result is valid in thread 0 only. sm and ss are shared arrays
// of 32 A each.
template <typename T, int N>
__device__ __forceinline__ cu::acc_of<T> block_row_lse(const T* z, int64_t v, cu::acc_of<T>* sm,
                                                       cu::acc_of<T>* ss) {
  using A = cu::acc_of<T>;
  State<A> st{A(-INFINITY), A(0)};
  const int64_t nvec = v / N;
  constexpr int kUnroll = 4;
  int64_t k = threadIdx.x;
  // kUnroll independent vector loads in flight per thread.
  for (; k + (kUnroll - 1) * static_cast<int64_t>(blockDim.x) < nvec; k += kUnroll * blockDim.x) {
    A x[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      load_n<T, N>(z + (k + u * static_cast<int64_t>(blockDim.x)) * N, x[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) add(st, x[u]);
  }
  for (; k < nvec; k += blockDim.x) {
    A x[N];
    load_n<T, N>(z + k * N, x);
    add(st, x);
  }
  for (int64_t j = nvec * N + threadIdx.x; j < v; j += blockDim.x) {
    const A x[1] = {cu::to_acc(z[j])};
    add(st, x);
  }
  // Warps by shuffles, then the warp results in warp order (deterministic).
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const State<A> other{__shfl_xor_sync(0xffffffffu, st.m, o),
                         __shfl_xor_sync(0xffffffffu, st.s, o)};
    st = merge(st, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = st.m;
    ss[warp] = st.s;
  }
  __syncthreads();
  if (threadIdx.x != 0) return A(NAN);
  State<A> t{A(-INFINITY), A(0)};
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t = merge(t, State<A>{sm[w], ss[w]});
  return t.m == -INFINITY ? A(NAN) : t.m + libm_log(t.s);
}

}  // namespace leantune::kernels::online
