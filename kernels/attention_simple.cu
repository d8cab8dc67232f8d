// The simple attention kernels (f32, f64, head_dim up to 512, pre-sm_80 devices, soft-capped
// scores; design in kernels/attention.cu): one warp per (row, head), keys one at a time with an
// online softmax; backward one warp per query row (dQ) and per key row (dK, dV summed over the
// group). A sliding window narrows each row's key range (and each key's query range).
#include "kernels/acc_math.cuh"
#include "kernels/attention_common.cuh"

namespace leantune::kernels::attention_detail {
namespace {

// Loads one head row (d values) into this lane's registers: value e is column lane + 32 e.
template <typename T, typename A>
__device__ __forceinline__ void load_row(const T* src, int d, int lane, A (&x)[kSimplePer]) {
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) {
    const int c = lane + 32 * e;
    x[e] = c < d ? cu::to_acc(src[c]) : A(0);
  }
}
template <typename T, typename A>
__device__ __forceinline__ void store_row(T* dst, int d, int lane, const A (&x)[kSimplePer],
                                          A mul) {
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) {
    const int c = lane + 32 * e;
    if (c < d) dst[c] = cu::from_acc<T>(x[e] * mul);
  }
}
template <typename T, typename A>
__device__ __forceinline__ A dot_row(const T* src, int d, int lane, const A (&x)[kSimplePer]) {
  A acc = 0;
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) {
    const int c = lane + 32 * e;
    if (c < d) acc += x[e] * cu::to_acc(src[c]);
  }
  return cu::warp_sum(acc);
}

// Number of keys query i (of lq) sees out of lk: the end of its range.
__device__ __forceinline__ int visible_keys(bool causal, int i, int lq, int lk) {
  return causal ? min(max(i + lk - lq + 1, 0), lk) : lk;
}
// The first key query i sees (a sliding window of `window` keys; 0 = none).
__device__ __forceinline__ int first_key(bool causal, int window, int i, int lq, int lk) {
  return causal && window > 0 ? max(visible_keys(causal, i, lq, lk) - window, 0) : 0;
}

// The score scale and soft-cap, in A. The host passes 1 / cap: a division in the key loop calls
// the IEEE slow path, whose call spills.
template <typename A>
struct ScoreParams {
  A scale, cap, inv_cap;
};
template <typename A>
__device__ __forceinline__ ScoreParams<A> score_params(const SimpleParams& p) {
  return {static_cast<A>(p.scale), static_cast<A>(p.softcap), static_cast<A>(p.softcap_inv)};
}
// The scaled score dot * scale as the softmax sees it (soft-capped when cap > 0); *t receives
// the tanh.
template <typename A>
__device__ __forceinline__ A score(const ScoreParams<A>& sp, A dot, A* t) {
  const A s = dot * sp.scale;
  if (sp.cap > A(0)) {
    *t = libm_tanh(s * sp.inv_cap);
    return sp.cap * *t;
  }
  *t = A(0);
  return s;
}

template <typename T>
__global__ void __launch_bounds__(kSimpleThreads)
    attention_fwd_simple_kernel(const SimpleParams p) {
  using A = cu::acc_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(p.tq) * p.hq) return;
  const int row = static_cast<int>(w / p.hq), h = static_cast<int>(w % p.hq);
  const int hk = h / p.group;
  T* orow = static_cast<T*>(p.o) + (static_cast<int64_t>(row) * p.hq + h) * p.d;
  A* lse = static_cast<A*>(p.lse) + static_cast<int64_t>(h) * p.tq + row;
  A o[kSimplePer];
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) o[e] = 0;
  const int b = seq_of_row(p.cu_q, p.batch, row);
  A m = -INFINITY, l = 0;
  if (b >= 0) {
    const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
    const int vis = visible_keys(p.causal, row - s.q0, s.lq, s.lk);
    const int first = first_key(p.causal, p.window, row - s.q0, s.lq, s.lk);
    A q[kSimplePer];
    load_row(static_cast<const T*>(p.q) + row * p.q_stride + static_cast<int64_t>(h) * p.d, p.d,
             lane, q);
    const T* kb = static_cast<const T*>(p.k) + s.k0 * p.k_stride + static_cast<int64_t>(hk) * p.d;
    const T* vb = static_cast<const T*>(p.v) + s.k0 * p.v_stride + static_cast<int64_t>(hk) * p.d;
    const ScoreParams<A> sp = score_params<A>(p);
    for (int j = first; j < vis; ++j) {
      A t;
      const A sc = score(sp, dot_row(kb + j * p.k_stride, p.d, lane, q), &t);
      A v[kSimplePer];
      load_row(vb + j * p.v_stride, p.d, lane, v);
      if (sc > m) {
        const A alpha = m == -INFINITY ? A(0) : libm_exp(m - sc);
        l = l * alpha + 1;
#pragma unroll
        for (int e = 0; e < kSimplePer; ++e) o[e] = o[e] * alpha + v[e];
        m = sc;
      } else {
        const A pj = libm_exp(sc - m);
        l += pj;
#pragma unroll
        for (int e = 0; e < kSimplePer; ++e) o[e] += pj * v[e];
      }
    }
  }
  const bool empty = !(l > 0);
  store_row(orow, p.d, lane, o, empty ? A(0) : A(1) / l);
  if (lane == 0) *lse = empty ? A(-INFINITY) : m + libm_log(l);
}

// dq for one (query row, head) per warp: dq = scale sum_j p_ij (dO_i . v_j - Dsum_i) k_j.
template <typename T>
__global__ void __launch_bounds__(kSimpleThreads)
    attention_bwd_dq_simple_kernel(const SimpleParams p) {
  using A = cu::acc_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(p.tq) * p.hq) return;
  const int row = static_cast<int>(w / p.hq), h = static_cast<int>(w % p.hq);
  const int hk = h / p.group;
  A acc[kSimplePer];
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) acc[e] = 0;
  const int b = seq_of_row(p.cu_q, p.batch, row);
  const int64_t stat = static_cast<int64_t>(h) * p.tq + row;
  const A lse = static_cast<const A*>(p.lse_in)[stat];
  if (b >= 0 && lse != -INFINITY) {
    const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
    const int vis = visible_keys(p.causal, row - s.q0, s.lq, s.lk);
    const int first = first_key(p.causal, p.window, row - s.q0, s.lq, s.lk);
    const A dsum = static_cast<const A*>(p.dsum)[stat];
    A q[kSimplePer], g[kSimplePer];
    load_row(static_cast<const T*>(p.q) + row * p.q_stride + static_cast<int64_t>(h) * p.d, p.d,
             lane, q);
    load_row(static_cast<const T*>(p.dout) + row * p.do_stride + static_cast<int64_t>(h) * p.d, p.d,
             lane, g);
    const T* kb = static_cast<const T*>(p.k) + s.k0 * p.k_stride + static_cast<int64_t>(hk) * p.d;
    const T* vb = static_cast<const T*>(p.v) + s.k0 * p.v_stride + static_cast<int64_t>(hk) * p.d;
    const ScoreParams<A> sp = score_params<A>(p);
    for (int j = first; j < vis; ++j) {
      const T* kr = kb + j * p.k_stride;
      A t;
      const A pj = libm_exp(score(sp, dot_row(kr, p.d, lane, q), &t) - lse);
      A ds = pj * (dot_row(vb + j * p.v_stride, p.d, lane, g) - dsum);
      if (sp.cap > A(0)) ds *= A(1) - t * t;
      A kv[kSimplePer];
      load_row(kr, p.d, lane, kv);
#pragma unroll
      for (int e = 0; e < kSimplePer; ++e) acc[e] += ds * kv[e];
    }
  }
  store_row(static_cast<T*>(p.dq) + (static_cast<int64_t>(row) * p.hq + h) * p.d, p.d, lane, acc,
            static_cast<A>(p.scale));
}

// dk, dv for one (key row, KV head) per warp, summed over the query heads of the group.
template <typename T>
__global__ void __launch_bounds__(kSimpleThreads)
    attention_bwd_dkdv_simple_kernel(const SimpleParams p) {
  using A = cu::acc_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(p.tk) * p.hk) return;
  const int row = static_cast<int>(w / p.hk), hk = static_cast<int>(w % p.hk);
  A dk[kSimplePer], dv[kSimplePer];
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) {
    dk[e] = 0;
    dv[e] = 0;
  }
  const int b = seq_of_row(p.cu_k, p.batch, row);
  if (b >= 0) {
    const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
    const int j = row - s.k0;
    // Query i sees key j iff j <= i + lk - lq (and, in a window, j > i + lk - lq - window).
    const int i_first = p.causal ? max(0, j - (s.lk - s.lq)) : 0;
    const int i_end = p.causal && p.window > 0 ? min(s.lq, j - (s.lk - s.lq) + p.window) : s.lq;
    A kr[kSimplePer], vr[kSimplePer];
    load_row(static_cast<const T*>(p.k) + row * p.k_stride + static_cast<int64_t>(hk) * p.d, p.d,
             lane, kr);
    load_row(static_cast<const T*>(p.v) + row * p.v_stride + static_cast<int64_t>(hk) * p.d, p.d,
             lane, vr);
    const ScoreParams<A> sp = score_params<A>(p);
    const A* lse = static_cast<const A*>(p.lse_in);
    const A* dsum = static_cast<const A*>(p.dsum);
    for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
      for (int i = i_first; i < i_end; ++i) {
        const int qrow = s.q0 + i;
        const int64_t stat = static_cast<int64_t>(h) * p.tq + qrow;
        const A l = lse[stat];
        if (l == -INFINITY) continue;
        const T* qp =
            static_cast<const T*>(p.q) + qrow * p.q_stride + static_cast<int64_t>(h) * p.d;
        const T* gp =
            static_cast<const T*>(p.dout) + qrow * p.do_stride + static_cast<int64_t>(h) * p.d;
        A t;
        const A pj = libm_exp(score(sp, dot_row(qp, p.d, lane, kr), &t) - l);
        A ds = pj * (dot_row(gp, p.d, lane, vr) - dsum[stat]);
        if (sp.cap > A(0)) ds *= A(1) - t * t;
        A qv[kSimplePer], gv[kSimplePer];
        load_row(qp, p.d, lane, qv);
        load_row(gp, p.d, lane, gv);
#pragma unroll
        for (int e = 0; e < kSimplePer; ++e) {
          dv[e] += pj * gv[e];
          dk[e] += ds * qv[e];
        }
      }
    }
  }
  const int64_t off = (static_cast<int64_t>(row) * p.hk + hk) * p.d;
  store_row(static_cast<T*>(p.dk) + off, p.d, lane, dk, static_cast<A>(p.scale));
  store_row(static_cast<T*>(p.dv) + off, p.d, lane, dv, A(1));
}

template <typename T>
void attention_fwd_simple_launch(const SimpleParams& p, cudaStream_t stream) {
  attention_fwd_simple_kernel<T>
      <<<warp_grid(static_cast<int64_t>(p.tq) * p.hq), kSimpleThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_bwd_simple_launch(const SimpleParams& p, cudaStream_t stream) {
  if (p.tq > 0) {
    attention_bwd_dq_simple_kernel<T>
        <<<warp_grid(static_cast<int64_t>(p.tq) * p.hq), kSimpleThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH();
  }
  if (p.tk > 0) {
    attention_bwd_dkdv_simple_kernel<T>
        <<<warp_grid(static_cast<int64_t>(p.tk) * p.hk), kSimpleThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void fwd_simple(const SimpleParams& p, DType dt, cudaStream_t stream) {
  LT_CU_DISPATCH_FLOAT(dt, T, attention_fwd_simple_launch<T>(p, stream));
}
void bwd_simple(const SimpleParams& p, DType dt, cudaStream_t stream) {
  LT_CU_DISPATCH_FLOAT(dt, T, attention_bwd_simple_launch<T>(p, stream));
}

}  // namespace leantune::kernels::attention_detail
