// rms_norm and add_rms_norm on CUDA.
//   x:[..., H] (rows = numel/H), w:[H], one float dtype (f32, bf16, f16, f64); y like x;
//   rstd:[rows] f32 (f64 for f64), contiguous.
// Forward, per row, with the CPU path's operation order (f32 math; f64 for f64):
//   ss = sum x^2;  rstd = 1 / sqrt(ss / H + eps);  xh = round_T(x * rstd);  y = round_T(w * xh)
//   (unit_offset: y = round_T((x * rstd) * (1 + w)), nothing rounded before)
//   add_rms_norm: x = round_T(a + b), formed in the same pass from a's and b's vectors and also
//   written out as sum (residual_add's sum, bit for bit).
// Backward, with xh = x * rstd unrounded and w' = w (unit_offset: 1 + w):
//   dot = sum ((dy * w') * x) * rstd;  dx = rstd * (dy * w' - xh * (dot / H))
//   dw = sum over rows of dy * round_T(x * rstd)  (unit_offset: dy * xh)
//   with dres (a gradient reaching x by another path): dx = round_T(round_T(dx) + dres), the sum
//   autograd would form.
// Layout: a row is spread over `tpr` threads (a power of two, 32..256), each holding up to
// kMaxIters 16-byte vectors of it in registers (as T, widened where used), so x and dy are read
// from memory exactly once; several rows share a block when rows are short. The weights a thread
// needs are loaded with its row (forward) or once per block (backward), never after a reduction.
// The backward grid is persistent: each block keeps per-column dw sums for the rows it visits in
// registers, folds its row lanes through shared memory in a fixed order and writes one f32 (f64)
// partial row; a second pass (cu::column_sum) adds the partial rows in order. No atomics: the
// result is deterministic for a given device. Rows too long for registers (H/V > 256 * kMaxIters:
// H > 8192 in bf16, 4096 in f32) take a two-pass loop kernel instead. Scratch: partials [P, H]
// f32 (f64), P = one resident wave of blocks (<= 8 * SMs), from the caching allocator
// (kWorkspace). Outputs must be contiguous; strided inputs are copied first, and operands are
// aligned first when vectors fit the rows (vector_rows). dx may alias dy or dres, y may alias x,
// sum may alias a or b (each thread reads its elements before writing them).
#include <type_traits>

#include "engine/cuda_blas.cuh"
#include "engine/cuda_utils.cuh"
#include "kernels/acc_math.cuh"
#include "kernels/cuda_device.cuh"
#include "kernels/rms_norm.h"
#include "kernels/stat_dtype.h"

namespace leantune::kernels {
namespace {

using cu::add_rn;
using cu::mul_rn;

constexpr int kMaxIters = 4;       // vectors per thread per row
constexpr int kMaxTpr = 256;       // threads per row (and per block)
constexpr int kRowThreads = 256;   // target threads per block when rows are short
constexpr int kLoopThreads = 256;  // loop kernels

// Round through T (the rounding Hugging Face applies to x * rstd).
template <typename T, typename A>
__device__ __forceinline__ A round_through(A v) {
  return static_cast<A>(cu::to_acc(cu::from_acc<T>(v)));
}

// The weight as applied: w, or 1 + w (unit_offset).
template <typename A>
__device__ __forceinline__ A eff_w(A w, bool offset) {
  return offset ? add_rn(A(1), w) : w;
}
// x * rstd as the output and dw use it: rounded through T, or not (unit_offset).
template <typename T, typename A>
__device__ __forceinline__ A normed(A xr, bool offset) {
  return offset ? xr : round_through<T>(xr);
}

// Sum over the blockDim.x threads of row lane threadIdx.y; all threads get it. red: [8][32].
template <typename A>
__device__ __forceinline__ A row_sum(A v, A (*red)[32]) {
  v = cu::warp_sum(v);
  const int wpr = blockDim.x >> 5;
  if (wpr == 1) return v;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // the previous call's readers are done with red
  if (lane == 0) red[threadIdx.y][warp] = v;
  __syncthreads();
  return cu::warp_sum(lane < wpr ? red[threadIdx.y][lane] : A(0));
}

// The 16-byte (or scalar) vector of T a thread holds in registers: its bits, widened to A where
// used, so that 16-bit rows take 4 registers per vector, not 8.
template <typename T, int V>
struct Raw {
  static_assert(V == 1 || sizeof(T) * V == 16, "scalar or 16-byte vectors");
  std::conditional_t<V == 1, T, uint4> bits;
};

__device__ __forceinline__ uint32_t word(const uint4& u, int i) {
  return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

// Element e of a vector in the accumulation type (exact: every T widens exactly).
template <typename T, int V>
__device__ __forceinline__ cu::acc_of<T> at(const Raw<T, V>& r, int e) {
  if constexpr (V == 1) {
    return cu::to_acc(r.bits);
  } else if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(word(r.bits, e));
  } else if constexpr (std::is_same_v<T, double>) {
    return __hiloint2double(static_cast<int>(word(r.bits, 2 * e + 1)),
                            static_cast<int>(word(r.bits, 2 * e)));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return cu::bf16_in_word(word(r.bits, e >> 1), e & 1);
  } else {
    const uint32_t w = word(r.bits, e >> 1);
    return cu::to_acc(__ushort_as_half(static_cast<unsigned short>((e & 1) ? w >> 16 : w)));
  }
}

// Thread's vectors k of a row (columns (threadIdx.x + k blockDim.x) V ...), those below nvec.
template <typename T, int V>
__device__ __forceinline__ void load_row(const T* row, int64_t nvec, bool valid,
                                         Raw<T, V> (&out)[kMaxIters]) {
  using Bits = decltype(out[0].bits);
#pragma unroll
  for (int k = 0; k < kMaxIters; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (valid && j < nvec) out[k].bits = reinterpret_cast<const Bits*>(row)[j];
  }
}

// Writes this thread's vectors of an output row: out_row[j V + e] = f(k, e) for vector k
// (j = threadIdx.x + k blockDim.x, those below nvec); with add_row, f's value rounded to T plus
// add_row's element (the residual gradient of rms_norm_bwd).
template <typename T, int V, typename F>
__device__ __forceinline__ void store_row(T* out_row, int64_t nvec, F f,
                                          const T* add_row = nullptr) {
  using A = cu::acc_of<T>;
#pragma unroll
  for (int k = 0; k < kMaxIters; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (j < nvec) {
      A out[V];
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = f(k, e);
      if (add_row) {
        Raw<T, V> r;
        r.bits = reinterpret_cast<const decltype(r.bits)*>(add_row)[j];
#pragma unroll
        for (int e = 0; e < V; ++e) out[e] = add_rn(round_through<T>(out[e]), at(r, e));
      }
      store_n<T, V>(out_row + j * V, out);
    }
  }
}

// x and w are loaded together before the row's reduction, so that the weight's latency (an L2
// hit) overlaps the row's instead of following it. kAdd (add_rms_norm): the row is
// round(x + b), formed from both inputs' vectors where used and also written to sum.
template <typename T, int V, bool kAdd>
__global__ void __launch_bounds__(kMaxTpr)
    rms_norm_fwd_kernel(const T* x, const T* b, T* sum, const T* __restrict__ w, T* y,
                        cu::acc_of<T>* __restrict__ rstd, int64_t rows, int64_t h,
                        cu::acc_of<T> eps, bool offset) {
  using A = cu::acc_of<T>;
  __shared__ A red[8][32];
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y;
  const bool valid = row < rows;
  const int64_t nvec = h / V;
  Raw<T, V> xv[kMaxIters], bv[kAdd ? kMaxIters : 1], wv[kMaxIters];
  load_row<T, V>(x + row * h, nvec, valid, xv);
  if constexpr (kAdd) load_row<T, V>(b + row * h, nvec, valid, bv);
  load_row<T, V>(w, nvec, valid, wv);
  auto xa = [&](int k, int e) {
    if constexpr (kAdd)
      return round_through<T>(add_rn(at(xv[k], e), at(bv[k], e)));
    else
      return at(xv[k], e);
  };
  A ss = 0;
#pragma unroll
  for (int k = 0; k < kMaxIters; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (valid && j < nvec)
#pragma unroll
      for (int e = 0; e < V; ++e) ss = add_rn(ss, mul_rn(xa(k, e), xa(k, e)));
  }
  ss = row_sum(ss, red);
  const A rs = div_rn(A(1), sqrt_rn(add_rn(div_rn(ss, static_cast<A>(h)), eps)));
  if (!valid) return;  // no barrier follows
  if (threadIdx.x == 0) rstd[row] = rs;
  if constexpr (kAdd) store_row<T, V>(sum + row * h, nvec, xa);
  store_row<T, V>(y + row * h, nvec, [&](int k, int e) {
    const A xr = mul_rn(xa(k, e), rs);
    return offset ? mul_rn(xr, eff_w(at(wv[k], e), true))
                  : mul_rn(at(wv[k], e), round_through<T>(xr));
  });
}

// Persistent over row groups (blockDim.y rows each). partial: [gridDim.x, h] or null; dx may be
// null. The thread's columns are the same in every row, so its weights are loaded once. Dynamic
// shared memory: blockDim.y * h accumulators when partial && blockDim.y > 1. Two blocks per SM:
// at most 128 registers (without that bound ptxas spilled the f16 scalar variant on sm_80,
// test_kernel_resources).
template <typename T, int V>
__global__ void __launch_bounds__(kMaxTpr, 2)
    rms_norm_bwd_kernel(const T* dy, const T* x, const T* __restrict__ w,
                        const cu::acc_of<T>* __restrict__ rstd, const T* dres, T* dx,
                        cu::acc_of<T>* __restrict__ partial, int64_t rows, int64_t h, bool offset) {
  using A = cu::acc_of<T>;
  __shared__ A red[8][32];
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const int64_t nvec = h / V;
  const int64_t groups = (rows + blockDim.y - 1) / blockDim.y;
  Raw<T, V> wv[kMaxIters];
  if (dx) load_row<T, V>(w, nvec, true, wv);
  A dw[kMaxIters][V];
#pragma unroll
  for (int k = 0; k < kMaxIters; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e) dw[k][e] = 0;

  for (int64_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
    const int64_t row = grp * blockDim.y + threadIdx.y;
    const bool valid = row < rows;
    const A rs = valid ? rstd[row] : A(0);
    Raw<T, V> xv[kMaxIters], gv[kMaxIters];
    load_row<T, V>(x + row * h, nvec, valid, xv);
    load_row<T, V>(dy + row * h, nvec, valid, gv);
    A dot = 0;
#pragma unroll
    for (int k = 0; k < kMaxIters; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (valid && j < nvec) {
        if (dx) {
#pragma unroll
          for (int e = 0; e < V; ++e)
            dot = add_rn(
                dot, mul_rn(mul_rn(mul_rn(at(gv[k], e), eff_w(at(wv[k], e), offset)), at(xv[k], e)),
                            rs));
        }
        if (partial) {
#pragma unroll
          for (int e = 0; e < V; ++e)
            dw[k][e] =
                add_rn(dw[k][e], mul_rn(at(gv[k], e), normed<T>(mul_rn(at(xv[k], e), rs), offset)));
        }
      }
    }
    if (dx) {
      dot = row_sum(dot, red);
      const A m = div_rn(dot, static_cast<A>(h));
      if (valid)
        store_row<T, V>(
            dx + row * h, nvec,
            [&](int k, int e) {
              return mul_rn(rs, add_rn(mul_rn(at(gv[k], e), eff_w(at(wv[k], e), offset)),
                                       -mul_rn(mul_rn(at(xv[k], e), rs), m)));
            },
            dres ? dres + row * h : nullptr);
    }
  }
  if (!partial) return;
  A* prow = partial + static_cast<int64_t>(blockIdx.x) * h;
  if (blockDim.y == 1) {
#pragma unroll
    for (int k = 0; k < kMaxIters; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (j < nvec)
#pragma unroll
        for (int e = 0; e < V; ++e) prow[j * V + e] = dw[k][e];
    }
    return;
  }
  // Fold the row lanes in lane order through shared memory.
  A* acc = reinterpret_cast<A*>(dyn_smem);
#pragma unroll
  for (int k = 0; k < kMaxIters; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (j < nvec)
#pragma unroll
      for (int e = 0; e < V; ++e) acc[threadIdx.y * h + j * V + e] = dw[k][e];
  }
  __syncthreads();
  if (threadIdx.y != 0) return;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    A t = 0;
    for (unsigned ly = 0; ly < blockDim.y; ++ly) t = add_rn(t, acc[ly * h + c]);
    prow[c] = t;
  }
}

// Rows too long for registers: one block per row, two passes over x. With b (add_rms_norm), the
// first pass forms the row round(x + b) and writes it to sum, and the second reads it back from
// there (the same thread wrote each element it reads).
template <typename T>
__global__ void rms_norm_fwd_loop_kernel(const T* x, const T* b, T* sum, const T* __restrict__ w,
                                         T* y, cu::acc_of<T>* __restrict__ rstd, int64_t h,
                                         cu::acc_of<T> eps, bool offset) {
  using A = cu::acc_of<T>;
  __shared__ A scratch[32];
  const int64_t row = blockIdx.x;
  A ss = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    A v = cu::to_acc(x[row * h + j]);
    if (b) {
      v = round_through<T>(add_rn(v, cu::to_acc(b[row * h + j])));
      sum[row * h + j] = cu::from_acc<T>(v);
    }
    ss = add_rn(ss, mul_rn(v, v));
  }
  const T* xr = (b ? sum : x) + row * h;
  ss = cu::block_sum(ss, scratch);
  const A rs = div_rn(A(1), sqrt_rn(add_rn(div_rn(ss, static_cast<A>(h)), eps)));
  if (threadIdx.x == 0) rstd[row] = rs;
  T* yr = y + row * h;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const A xn = mul_rn(cu::to_acc(xr[j]), rs);
    yr[j] = cu::from_acc<T>(offset ? mul_rn(xn, eff_w(cu::to_acc(w[j]), true))
                                   : mul_rn(cu::to_acc(w[j]), round_through<T>(xn)));
  }
}

// Persistent; each block owns partial row blockIdx.x (zeroed here) and adds its rows in order.
template <typename T>
__global__ void rms_norm_bwd_loop_kernel(const T* dy, const T* x, const T* __restrict__ w,
                                         const cu::acc_of<T>* __restrict__ rstd, const T* dres,
                                         T* dx, cu::acc_of<T>* __restrict__ partial, int64_t rows,
                                         int64_t h, bool offset) {
  using A = cu::acc_of<T>;
  __shared__ A scratch[32];
  A* prow = partial ? partial + static_cast<int64_t>(blockIdx.x) * h : nullptr;
  if (prow)
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) prow[j] = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * h;
    const T* gr = dy + row * h;
    const A rs = rstd[row];
    A m = 0;
    if (dx) {
      A dot = 0;
      for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
        dot = add_rn(dot, mul_rn(mul_rn(mul_rn(cu::to_acc(gr[j]), eff_w(cu::to_acc(w[j]), offset)),
                                        cu::to_acc(xr[j])),
                                 rs));
      dot = cu::block_sum(dot, scratch);
      m = div_rn(dot, static_cast<A>(h));
    }
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      const A xv = cu::to_acc(xr[j]), gv = cu::to_acc(gr[j]);
      if (dx) {
        A d = mul_rn(
            rs, add_rn(mul_rn(gv, eff_w(cu::to_acc(w[j]), offset)), -mul_rn(mul_rn(xv, rs), m)));
        if (dres) d = add_rn(round_through<T>(d), cu::to_acc(dres[row * h + j]));
        dx[row * h + j] = cu::from_acc<T>(d);
      }
      if (prow) prow[j] = add_rn(prow[j], mul_rn(gv, normed<T>(mul_rn(xv, rs), offset)));
    }
  }
}

struct RowConfig {
  int vec;    // elements per vector access
  int tpr;    // threads per row
  int rpb;    // rows per block
  bool regs;  // the row fits in registers
};

RowConfig row_config(int64_t h, int vec) {
  RowConfig c;
  c.vec = vec;
  const int64_t nvec = h / vec;
  c.tpr = 32;
  while (static_cast<int64_t>(c.tpr) * kMaxIters < nvec && c.tpr < kMaxTpr) c.tpr *= 2;
  c.regs = static_cast<int64_t>(c.tpr) * kMaxIters >= nvec;
  c.rpb = std::max(1, kRowThreads / c.tpr);
  return c;
}

template <typename T>
bool can_vectorize(int64_t h, std::initializer_list<const void*> ptrs) {
  if (h % cu::VecWidth<T>::value != 0) return false;
  for (const void* p : ptrs)
    if (p && !cu::aligned16(p)) return false;
  return true;
}

// b and sum both null (rms_norm) or both set (add_rms_norm: the row is round(x + b)).
template <typename T, int V>
void fwd_rows(dim3 grid, dim3 block, cudaStream_t stream, const T* x, const T* b, T* sum,
              const T* w, T* y, cu::acc_of<T>* rstd, int64_t rows, int64_t h, cu::acc_of<T> eps,
              bool offset) {
  if (b)
    rms_norm_fwd_kernel<T, V, true>
        <<<grid, block, 0, stream>>>(x, b, sum, w, y, rstd, rows, h, eps, offset);
  else
    rms_norm_fwd_kernel<T, V, false>
        <<<grid, block, 0, stream>>>(x, b, sum, w, y, rstd, rows, h, eps, offset);
}

void rms_norm_fwd_launch(const void* x, const void* b, void* sum, const void* w, void* y,
                         void* rstd, int64_t rows, int64_t h, double eps, bool offset, DType dt,
                         cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  LT_CHECK(rows < (int64_t{1} << 31), "rms_norm: too many rows ", rows);
  LT_CHECK((b == nullptr) == (sum == nullptr), "rms_norm: b and sum go together");
  LT_CU_DISPATCH_FLOAT(dt, T, {
    using A = cu::acc_of<T>;
    const T* px = static_cast<const T*>(x);
    const T* pb = static_cast<const T*>(b);
    T* ps = static_cast<T*>(sum);
    const T* pw = static_cast<const T*>(w);
    T* py = static_cast<T*>(y);
    A* pr = static_cast<A*>(rstd);
    const A e = static_cast<A>(eps);
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = can_vectorize<T>(h, {x, b, sum, w, y});
    const RowConfig c = row_config(h, vec ? kVec : 1);
    if (c.regs) {
      const dim3 block(c.tpr, c.rpb);
      const dim3 grid(static_cast<unsigned>((rows + c.rpb - 1) / c.rpb));
      if (vec)
        fwd_rows<T, kVec>(grid, block, stream, px, pb, ps, pw, py, pr, rows, h, e, offset);
      else
        fwd_rows<T, 1>(grid, block, stream, px, pb, ps, pw, py, pr, rows, h, e, offset);
    } else {
      rms_norm_fwd_loop_kernel<T><<<static_cast<unsigned>(rows), kLoopThreads, 0, stream>>>(
          px, pb, ps, pw, py, pr, h, e, offset);
    }
    CUDA_CHECK_LAUNCH();
  });
}

// dw (when non-null) of dtype dw_type.
void rms_norm_bwd_launch(const void* dy, const void* x, const void* w, const void* rstd,
                         const void* dres, void* dx, void* dw, DType dw_type, int64_t rows,
                         int64_t h, bool offset, DType dt, Device dev, cudaStream_t stream) {
  if (h == 0 || (!dx && !dw)) return;
  if (rows == 0) {
    if (dw)
      CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(h) * dtype_size(dw_type), stream));
    return;
  }
  const int sms = cu::device_info(dev.index).sm_count;
  LT_CU_DISPATCH_FLOAT(dt, T, {
    using A = cu::acc_of<T>;
    const T* pg = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(w);
    const A* pr = static_cast<const A*>(rstd);
    const T* pres = static_cast<const T*>(dres);
    T* pdx = static_cast<T*>(dx);
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = can_vectorize<T>(h, {dy, x, w, dres, dx});
    const RowConfig c = row_config(h, vec ? kVec : 1);
    const int threads = c.regs ? c.tpr * c.rpb : kLoopThreads;
    const int64_t groups = c.regs ? (rows + c.rpb - 1) / c.rpb : rows;
    const size_t smem =
        (dw && c.regs && c.rpb > 1) ? static_cast<size_t>(c.rpb * h) * sizeof(A) : 0;
    LT_CHECK(smem <= 48 * 1024, "rms_norm_bwd: shared memory ", smem);
    // One resident wave of persistent blocks: fewer partial rows than a grid sized by the work.
    int per_sm = 0;
    const void* fn = !c.regs ? reinterpret_cast<const void*>(&rms_norm_bwd_loop_kernel<T>)
                     : vec   ? reinterpret_cast<const void*>(&rms_norm_bwd_kernel<T, kVec>)
                             : reinterpret_cast<const void*>(&rms_norm_bwd_kernel<T, 1>);
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem));
    per_sm = std::clamp(per_sm, 1, 8);
    const int64_t grid = std::min<int64_t>(groups, static_cast<int64_t>(sms) * per_sm);
    Tensor partial;
    A* pp = nullptr;
    if (dw) {
      partial = cu::workspace(static_cast<size_t>(grid * h) * sizeof(A), dev);
      pp = static_cast<A*>(partial.data_ptr());
    }
    if (c.regs) {
      const dim3 block(c.tpr, c.rpb);
      if (vec)
        rms_norm_bwd_kernel<T, kVec><<<static_cast<unsigned>(grid), block, smem, stream>>>(
            pg, px, pw, pr, pres, pdx, pp, rows, h, offset);
      else
        rms_norm_bwd_kernel<T, 1><<<static_cast<unsigned>(grid), block, smem, stream>>>(
            pg, px, pw, pr, pres, pdx, pp, rows, h, offset);
    } else {
      rms_norm_bwd_loop_kernel<T><<<static_cast<unsigned>(grid), kLoopThreads, 0, stream>>>(
          pg, px, pw, pr, pres, pdx, pp, rows, h, offset);
    }
    CUDA_CHECK_LAUNCH();
    if (dw)
      cu::column_sum(pp, dt == DType::kF64 ? DType::kF64 : DType::kF32, grid, h, h, dw, dw_type,
                     dev, stream);
  });
}

int64_t rows_of(const char* op, const Tensor& x, const Tensor& w) {
  LT_CHECK(x.dim() >= 1 && w.dim() == 1 && x.size(-1) == w.size(0) && x.dtype() == w.dtype() &&
               dtype_is_floating(x.dtype()),
           op, ": x ", x.str(), ", w ", w.str());
  return w.size(0) == 0 ? 0 : x.numel() / w.size(0);
}

// Operands reach the kernels 16-byte aligned whenever the row length allows vectors, so that the
// kernel and its reduction order (vector width, threads per row) follow from h alone, never from
// where the data lies: rms_norm of a misaligned view, and add_rms_norm against residual_add then
// rms_norm, give the same bits as of aligned data. A misaligned input is copied (kWorkspace); a
// misaligned output is written through a workspace and copied out (cu::out_operand).
bool vector_rows(int64_t h, DType dt) {
  return h % (16 / static_cast<int64_t>(dtype_size(dt))) == 0;
}

Tensor aligned_in(const Tensor& t, bool vec) {
  return vec ? cu::aligned16_ws(t) : cu::contiguous_ws(t);
}

// The checks both forward adapters make of their outputs y and rstd for x.
int64_t check_fwd_outputs(const char* op, const Tensor& x, const Tensor& w, const Tensor& y,
                          const Tensor& rstd, Device d) {
  cu::check_on(w, d, op, "w");
  const int64_t rows = rows_of(op, x, w);
  cu::check_operand(y, d, op, "y");
  cu::check_operand(rstd, d, op, "rstd");
  LT_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype(), op, ": y ", y.str(), " for x ",
           x.str());
  LT_CHECK(rstd.numel() == rows && rstd.dtype() == stat_dtype(x.dtype()), op, ": rstd ", rstd.str(),
           " for x ", x.str());
  return rows;
}

}  // namespace

void rms_norm_fwd_cuda(const Tensor& x, const Tensor& w, double eps, bool unit_offset,
                       const Tensor& y, const Tensor& rstd) {
  const char* op = "rms_norm_fwd_cuda";
  const Device d = cuda_device_of(x, op, "x");
  const int64_t rows = check_fwd_outputs(op, x, w, y, rstd, d);
  cu::DeviceGuard g(d);
  const bool vec = vector_rows(w.size(0), x.dtype());
  const Tensor xc = aligned_in(x, vec), wc = aligned_in(w, vec);
  const cu::OutOperand yo = cu::out_operand(y, vec);
  rms_norm_fwd_launch(xc.data_ptr(), nullptr, nullptr, wc.data_ptr(), yo.ptr(), rstd.data_ptr(),
                      rows, w.size(0), eps, unit_offset, x.dtype(), cu::stream_of(d));
  yo.finish();
}

void add_rms_norm_fwd_cuda(const Tensor& a, const Tensor& b, const Tensor& w, double eps,
                           bool unit_offset, const Tensor& sum, const Tensor& y,
                           const Tensor& rstd) {
  const char* op = "add_rms_norm_fwd_cuda";
  const Device d = cuda_device_of(a, op, "a");
  cu::check_on(b, d, op, "b");
  const int64_t rows = check_fwd_outputs(op, a, w, y, rstd, d);
  cu::check_operand(sum, d, op, "sum");
  LT_CHECK(b.shape() == a.shape() && b.dtype() == a.dtype() && sum.shape() == a.shape() &&
               sum.dtype() == a.dtype(),
           op, ": b ", b.str(), ", sum ", sum.str(), " for a ", a.str());
  cu::DeviceGuard g(d);
  const bool vec = vector_rows(w.size(0), a.dtype());
  const Tensor ac = aligned_in(a, vec), bc = aligned_in(b, vec), wc = aligned_in(w, vec);
  const cu::OutOperand so = cu::out_operand(sum, vec), yo = cu::out_operand(y, vec);
  rms_norm_fwd_launch(ac.data_ptr(), bc.data_ptr(), so.ptr(), wc.data_ptr(), yo.ptr(),
                      rstd.data_ptr(), rows, w.size(0), eps, unit_offset, a.dtype(),
                      cu::stream_of(d));
  so.finish();
  yo.finish();
}

void rms_norm_bwd_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       bool unit_offset, const Tensor& dx, const Tensor& dw, const Tensor& dres) {
  const char* op = "rms_norm_bwd_cuda";
  const Device d = cuda_device_of(x, op, "x");
  cu::check_on(w, d, op, "w");
  cu::check_on(dy, d, op, "dy");
  cu::check_on(rstd, d, op, "rstd");
  const int64_t rows = rows_of(op, x, w);
  LT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), op, ": dy ", dy.str(), " for x ",
           x.str());
  LT_CHECK(rstd.numel() == rows && rstd.dtype() == stat_dtype(x.dtype()), op, ": rstd ", rstd.str(),
           " for x ", x.str());
  if (dx.defined()) {
    cu::check_operand(dx, d, op, "dx");
    LT_CHECK(dx.shape() == x.shape() && dx.dtype() == x.dtype(), op, ": dx ", dx.str());
  }
  if (dw.defined()) {
    cu::check_operand(dw, d, op, "dw");
    LT_CHECK(dw.shape() == w.shape() && dtype_is_floating(dw.dtype()) &&
                 (dw.dtype() == DType::kF64) == (x.dtype() == DType::kF64),
             op, ": dw ", dw.str(), " for w ", w.str());
  }
  if (dres.defined()) {
    cu::check_on(dres, d, op, "dres");
    LT_CHECK(dres.shape() == x.shape() && dres.dtype() == x.dtype() && dx.defined(), op, ": dres ",
             dres.str(), " for x ", x.str(), " (and dx wanted)");
  }
  cu::DeviceGuard g(d);
  const bool vec = vector_rows(w.size(0), x.dtype());
  const Tensor xc = aligned_in(x, vec), wc = aligned_in(w, vec), gc = aligned_in(dy, vec),
               rc = cu::contiguous_ws(rstd);
  const Tensor resc = dres.defined() ? aligned_in(dres, vec) : Tensor();
  const cu::OutOperand dxo = cu::out_operand(dx, vec);
  rms_norm_bwd_launch(gc.data_ptr(), xc.data_ptr(), wc.data_ptr(), rc.data_ptr(),
                      resc.defined() ? resc.data_ptr() : nullptr, dxo.ptr(),
                      dw.defined() ? dw.data_ptr() : nullptr, dw.defined() ? dw.dtype() : x.dtype(),
                      rows, w.size(0), unit_offset, x.dtype(), d, cu::stream_of(d));
  dxo.finish();
}

}  // namespace leantune::kernels
