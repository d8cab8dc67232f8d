// linear_cross_entropy on CUDA: the LM head and the loss fused, chunked over the rows that have a
// valid target, never holding the full [T, V] logits (kernels/linear_cross_entropy.h).
//   hidden:[T,H], weight:[V,H] (one float dtype, inner stride 1; other layouts are copied),
//   targets:[T] i32|i64 on the host or the device (-100 = ignored) -> sum over valid rows of
//   nll_t = lse_t - z[t, y_t] (a double); with gradients, of (sum nll) * grad_scale:
//   dhidden [T,H] (any float dtype, contiguous; overwritten, 0 on ignored rows) and
//   dweight [V,H] (any float dtype; accumulated into).
// Math: the work dtype A is f32 (f64 for f64 inputs); logits are stored in the input dtype (bf16
// or f16 for 16-bit inputs, as Liger and QuACK do; f32 for f32, f64 for f64), every product
// accumulates in A. Targets are read back to the host once (a device tensor costs one
// synchronisation), validated there (a bad target throws kInput before any work, naming it) and
// compacted into the list of valid rows, so no GEMM work is spent on ignored rows.
// Per chunk of c valid rows:
//   X_c  = hidden[rows]                         (a view when the rows are consecutive, else a
//                                                gather into a [c,H] buffer)
//   Z    = X_c W^T               [c,V]          cuBLASLt, logits dtype, A accumulation
//   rows kernel: lse_r by a one-pass online max/sum, nll_r = lse_r - z_y; with gradients Z is
//   overwritten by G = softmax - onehot, unscaled in [-1, 1] (formed in A before the one
//   rounding; kernels/linear_cross_entropy_grad.h says why grad_scale is not folded in here)
//   dX_c = grad_scale G W        [c,H]          grad_scale as the GEMM's alpha; written straight
//                                                into dhidden when the rows are consecutive, else
//                                                into a buffer and scattered
//   dW  += grad_scale G^T X_c    [V,H]          cuBLASLt, alpha = grad_scale, beta = 1, straight
//                                                into dweight when it is contiguous and A-typed or
//                                                of the inputs' dtype (a bf16 dW, as
//                                                linear_cross_entropy holds it, is rounded once per
//                                                chunk), else into an A-typed copy written back
// Soft-capping (opt.softcap = c > 0): a pass over the chunk's logits maps Z to c tanh(Z / c) in
// place (rounded to the logits dtype) before the rows kernel, which multiplies each gradient
// entry by 1 - (Z/c)^2 from the capped value it reads.
// opt.stats (TRL's SFT entropy and top-1 share): before the rows kernel, cross_entropy.cu's
// forward and row-statistics kernels (cross_entropy_launch.cuh) read each chunk's logits twice
// more, into [n] entropy and top-1 arrays summed in row order at the end, with no synchronisation
// per chunk (not with soft-capping).
// The per-row nll values land in one [n] array that is copied back and summed in row order in
// double at the end (deterministic whatever the chunking; the one synchronisation).
// Chunk size: c = min(opt.chunk_tokens, valid rows, budget rows) with the budget rows chosen so
// that the chunk's logits and X_c / dX_c buffers stay within kChunkBudgetBytes (768 MiB; rounded
// down to a multiple of 128 rows): 2560 rows for V = 151936 in bf16 at H = 1536.
// Peak extra device memory: c (V sizeof(logits) + H (sizeof(hidden) + sizeof(dX buffer))) +
// 12 n bytes (row list, targets, nll) + cuBLASLt workspace (<= 32 MiB); plus, only when dweight is
// neither A-typed nor of the inputs' dtype, or not contiguous, a [V,H] A-typed accumulator, and
// contiguous copies of hidden/weight when their rows are not dense. Nothing else grows with T. All
// scratch is tagged kWorkspace.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/cuda_blas.cuh"
#include "engine/cuda_utils.cuh"
#include "kernels/acc_math.cuh"
#include "kernels/cross_entropy.h"
#include "kernels/cross_entropy_launch.cuh"
#include "kernels/cuda_device.cuh"
#include "kernels/linear_cross_entropy.h"
#include "kernels/linear_cross_entropy_grad.h"
#include "kernels/online_softmax.cuh"
#include "kernels/stat_dtype.h"

namespace leantune::kernels {
namespace {

constexpr int64_t kChunkBudgetBytes = int64_t{768} << 20;
constexpr int64_t kChunkRowQuantum = 128;

using online::exp_acc;

// One block per chunk row r: lse by an online max/sum over z[r, :] (one read), nll[r] =
// lse - z[r, y_r]; when `grads`, z[r, :] is overwritten by G = softmax - onehot, unscaled (a
// second read and one write). N = elements per vector access (1 when unaligned).
// z <- cap * tanh(z / cap) over n elements, in place.
template <typename T>
__global__ void linear_ce_softcap_kernel(T* z, int64_t n, cu::acc_of<T> cap) {
  using A = cu::acc_of<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const A x = cu::to_acc(z[i]) / cap;
    z[i] = cu::from_acc<T>(cap * libm_tanh(x));
  }
}

// The gradient entry's tanh' factor for a capped logit zc (1 without soft-capping).
template <typename A>
__device__ __forceinline__ A softcap_slope(A zc, A cap) {
  if (cap <= A(0)) return A(1);
  const A t = zc / cap;
  return A(1) - t * t;
}

template <typename T, int N>
__global__ void linear_ce_rows_kernel(T* z, int64_t v, const int32_t* __restrict__ targets,
                                      cu::acc_of<T>* __restrict__ nll, bool grads,
                                      cu::acc_of<T> cap) {
  using A = cu::acc_of<T>;
  __shared__ A sm[32], ss[32];
  __shared__ A lse_sh;
  const int64_t row = blockIdx.x;
  T* zr = z + row * v;
  const int64_t nvec = v / N;
  const A row_lse = online::block_row_lse<T, N>(zr, v, sm, ss);
  const int64_t y = targets[row];
  if (threadIdx.x == 0) {
    lse_sh = row_lse;
    // z[y] is read here, before any thread overwrites the row (after the barrier below).
    nll[row] = row_lse - cu::to_acc(zr[y]);
  }
  if (!grads) return;
  __syncthreads();
  const A l = lse_sh;
  for (int64_t kk = threadIdx.x; kk < nvec; kk += blockDim.x) {
    A x[N];
    load_n<T, N>(zr + kk * N, x);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const A p = exp_acc(x[j] - l);
      x[j] = linear_ce_grad_entry(p, kk * N + j == y) * softcap_slope(x[j], cap);
    }
    store_n<T, N>(zr + kk * N, x);
  }
  for (int64_t j = nvec * N + threadIdx.x; j < v; j += blockDim.x) {
    const A zj = cu::to_acc(zr[j]);
    const A p = exp_acc(zj - l);
    zr[j] = cu::from_acc<T>(linear_ce_grad_entry(p, j == y) * softcap_slope(zj, cap));
  }
}

// dst[r, :] = src[rows[r], :] for r < c (row strides ld_src, ld_dst; both of dtype T).
template <typename T>
__global__ void linear_ce_gather_kernel(const T* __restrict__ src, int64_t ld_src,
                                        const int32_t* __restrict__ rows, T* __restrict__ dst,
                                        int64_t ld_dst, int64_t c, int64_t h) {
  const int64_t n = c * h;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / h, j = i % h;
    dst[r * ld_dst + j] = src[rows[r] * ld_src + j];
  }
}

// dst[rows[r], :] = convert(src[r, :]) for r < c; dst is [T,h] contiguous.
template <typename S, typename D>
__global__ void linear_ce_scatter_kernel(const S* __restrict__ src,
                                         const int32_t* __restrict__ rows, D* __restrict__ dst,
                                         int64_t c, int64_t h) {
  const int64_t n = c * h;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / h, j = i % h;
    dst[rows[r] * h + j] = cu::from_acc<D>(cu::to_acc(src[i]));
  }
}

int rows_block_threads(int64_t nvec) {
  if (nvec >= 8192) return 512;
  if (nvec >= 1024) return 256;
  return 128;
}

void linear_ce_rows_launch(void* z, DType dt, int64_t c, int64_t v, const int32_t* targets,
                           void* nll, bool grads, double softcap, Device dev, cudaStream_t stream) {
  if (c == 0) return;
  LT_CU_DISPATCH_FLOAT(dt, T, {
    using A = cu::acc_of<T>;
    const A cap = static_cast<A>(softcap);
    if (softcap > 0) {
      const unsigned blocks = cu::grid_blocks(c * v, 256, dev.index, 4, 256);
      linear_ce_softcap_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(z), c * v, cap);
      CUDA_CHECK_LAUNCH();
    }
    constexpr int kVec = cu::VecWidth<T>::value;
    // Row starts stay 16-byte aligned when V is a multiple of the vector width.
    const bool vec = v % kVec == 0 && cu::aligned16(z);
    const int threads = rows_block_threads(vec ? v / kVec : v);
    T* pz = static_cast<T*>(z);
    A* pn = static_cast<A*>(nll);
    if (vec)
      linear_ce_rows_kernel<T, kVec>
          <<<static_cast<unsigned>(c), threads, 0, stream>>>(pz, v, targets, pn, grads, cap);
    else
      linear_ce_rows_kernel<T, 1>
          <<<static_cast<unsigned>(c), threads, 0, stream>>>(pz, v, targets, pn, grads, cap);
    CUDA_CHECK_LAUNCH();
  });
}

void linear_ce_gather_launch(const void* src, int64_t ld_src, const int32_t* rows, void* dst,
                             int64_t c, int64_t h, DType dt, Device dev, cudaStream_t stream) {
  if (c == 0 || h == 0) return;
  const unsigned blocks = cu::grid_blocks(c * h, 256, dev.index, 4, 256);
  LT_CU_DISPATCH_FLOAT(dt, T, {
    linear_ce_gather_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<const T*>(src), ld_src, rows,
                                                           static_cast<T*>(dst), h, c, h);
    CUDA_CHECK_LAUNCH();
  });
}

void linear_ce_scatter_launch(const void* src, DType src_dt, const int32_t* rows, void* dst,
                              DType dst_dt, int64_t c, int64_t h, Device dev, cudaStream_t stream) {
  if (c == 0 || h == 0) return;
  const unsigned blocks = cu::grid_blocks(c * h, 256, dev.index, 4, 256);
  LT_CU_DISPATCH_FLOAT(src_dt, S, {
    LT_CU_DISPATCH_FLOAT(dst_dt, Dt, {
      linear_ce_scatter_kernel<S, Dt><<<blocks, 256, 0, stream>>>(static_cast<const S*>(src), rows,
                                                                  static_cast<Dt*>(dst), c, h);
      CUDA_CHECK_LAUNCH();
    });
  });
}

// A 2-D operand with unit inner stride: pointer and leading dimension; copied otherwise.
struct Rows2d {
  Tensor keep;
  const void* ptr = nullptr;
  int64_t ld = 0;
};

Rows2d as_rows(const Tensor& t) {
  Rows2d r;
  const int64_t rows = t.size(0), cols = t.size(1);
  if ((t.strides()[1] == 1 || cols == 1) && (rows <= 1 || t.strides()[0] >= cols)) {
    r.keep = t;
    r.ptr = t.data_ptr();
    r.ld = rows <= 1 ? std::max<int64_t>(cols, 1) : std::max<int64_t>(t.strides()[0], 1);
    return r;
  }
  r.keep = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  ops::copy(r.keep, t);
  r.ptr = r.keep.data_ptr();
  r.ld = std::max<int64_t>(cols, 1);
  return r;
}

DType work_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

// Rows per chunk for the memory budget (multiple of kChunkRowQuantum when that many fit).
int64_t budget_rows(int64_t v, int64_t h, size_t logit_bytes, size_t in_bytes, size_t dx_bytes) {
  const int64_t per_row =
      v * static_cast<int64_t>(logit_bytes) + h * static_cast<int64_t>(in_bytes + dx_bytes) + 16;
  const int64_t rows = std::max<int64_t>(1, kChunkBudgetBytes / per_row);
  return rows >= kChunkRowQuantum ? rows / kChunkRowQuantum * kChunkRowQuantum : rows;
}

}  // namespace

double linear_cross_entropy_fwd_bwd_cuda(const Tensor& hidden, const Tensor& weight,
                                         const Tensor& targets, double grad_scale,
                                         const Tensor& dhidden, const Tensor& dweight,
                                         const LinearCrossEntropyOptions& opt) {
  const char* op = "linear_cross_entropy_cuda";
  LT_CHECK(hidden.defined() && weight.defined() && targets.defined(), op,
           ": hidden, weight and targets must be defined");
  const Device d = cuda_device_of(hidden, op, "hidden");
  cu::check_on(weight, d, op, "weight");
  linear_cross_entropy_check_operands(op, hidden, weight, targets);
  LT_CHECK(targets.device().is_cpu() || targets.device() == d, op, ": targets ", targets.str(),
           " for hidden on ", d.str());
  LT_CHECK(opt.chunk_tokens > 0, op, ": chunk_tokens ", opt.chunk_tokens, " must be positive");
  const int64_t t = hidden.size(0), h = hidden.size(1), v = weight.size(0);
  LT_CHECK(t < (int64_t{1} << 31) && v < (int64_t{1} << 31), op, ": ", hidden.str(), " x ",
           weight.str(), " exceed the 32-bit row and target indices");
  if (dhidden.defined()) {
    cu::check_operand(dhidden, d, op, "dhidden");
    LT_CHECK(dhidden.shape() == hidden.shape() && dtype_is_floating(dhidden.dtype()), op,
             ": dhidden ", dhidden.str(), " for hidden ", hidden.str());
  }
  if (dweight.defined()) {
    cu::check_on(dweight, d, op, "dweight");
    LT_CHECK(dweight.shape() == weight.shape() && dtype_is_floating(dweight.dtype()), op,
             ": dweight ", dweight.str(), " for weight ", weight.str());
  }

  // Valid rows and their targets, checked on the host with the CPU path's message.
  const std::vector<int64_t> y = targets.to_i64();
  std::vector<int32_t> rows, tgt;
  rows.reserve(y.size());
  tgt.reserve(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == kIgnoreIndex) continue;
    LT_CHECK_INPUT(y[i] >= 0 && y[i] < v, "linear_cross_entropy: target ", y[i], " at position ", i,
                   " is outside the vocabulary [0, ", v, ") and is not the ignore index ",
                   kIgnoreIndex);
    rows.push_back(static_cast<int32_t>(i));
    tgt.push_back(static_cast<int32_t>(y[i]));
  }
  const int64_t n = static_cast<int64_t>(rows.size());

  cu::DeviceGuard guard(d);
  cudaStream_t stream = cu::stream_of(d);
  const bool grads = dhidden.defined() || dweight.defined();
  // Ignored rows get zero gradients: zero everything, the chunks overwrite the valid rows.
  if (dhidden.defined() && n < t && dhidden.numel() > 0)
    CUDA_CHECK(cudaMemsetAsync(dhidden.data_ptr(), 0, dhidden.nbytes(), stream));
  LT_CHECK(!opt.stats || opt.softcap == 0, op,
           ": row statistics of soft-capped logits are not supported on CUDA");
  // h == 0: every logit is 0, so nll = log V per valid row and no gradient flows.
  if (n == 0 || h == 0) {
    if (opt.stats) {
      opt.stats->entropy_sum += static_cast<double>(n) * std::log(static_cast<double>(v));
      opt.stats->top1 += std::count(tgt.begin(), tgt.end(), 0);
    }
    return static_cast<double>(n) * std::log(static_cast<double>(v));
  }

  const DType in = hidden.dtype();
  const DType wdt = work_dtype(in);  // A
  const DType logit_dt = in;         // bf16/f16 logits for 16-bit inputs, else A
  const Rows2d hr = as_rows(hidden), wr = as_rows(weight);

  // dX: straight into dhidden when its dtype is one cuBLASLt can write from these inputs.
  const bool dx_direct_type =
      dhidden.defined() &&
      (dhidden.dtype() == in || (dhidden.dtype() == DType::kF32 && in != DType::kF64));
  const DType dx_dt = dhidden.defined() ? (dx_direct_type ? dhidden.dtype() : wdt) : wdt;

  // Rows per chunk.
  const int64_t cap = std::min<int64_t>({opt.chunk_tokens, n,
                                         budget_rows(v, h, dtype_size(logit_dt), dtype_size(in),
                                                     dhidden.defined() ? dtype_size(dx_dt) : 0)});
  // A chunk uses hidden / dhidden rows in place when its valid rows are consecutive and the
  // views are 16-byte aligned (cuBLASLt's fast kernels need it); else gather / scatter.
  const char* hbase = static_cast<const char*>(hr.ptr);
  const size_t in_size = dtype_size(in);
  auto x_view = [&](int64_t c0) {
    return hbase + static_cast<size_t>(rows[c0]) * static_cast<size_t>(hr.ld) * in_size;
  };
  auto dx_view = [&](int64_t c0) {
    return static_cast<char*>(dhidden.data_ptr()) +
           static_cast<size_t>(rows[c0]) * static_cast<size_t>(h) * dtype_size(dhidden.dtype());
  };
  auto consecutive = [&](int64_t c0, int64_t c) { return rows[c0 + c - 1] - rows[c0] == c - 1; };
  auto x_in_place = [&](int64_t c0, int64_t c) {
    return consecutive(c0, c) && cu::aligned16(x_view(c0)) &&
           (static_cast<size_t>(hr.ld) * in_size) % 16 == 0;
  };
  auto dx_in_place = [&](int64_t c0, int64_t c) {
    return dx_direct_type && consecutive(c0, c) && cu::aligned16(dx_view(c0)) &&
           (static_cast<size_t>(h) * dtype_size(dhidden.dtype())) % 16 == 0;
  };
  bool any_gather = false, any_scatter = false;
  for (int64_t c0 = 0; c0 < n; c0 += cap) {
    const int64_t c = std::min(cap, n - c0);
    any_gather = any_gather || !x_in_place(c0, c);
    any_scatter = any_scatter || (dhidden.defined() && !dx_in_place(c0, c));
  }

  // Device-side row list, targets and per-row nll.
  Tensor rows_d = Tensor::empty({n}, DType::kI32, d, MemTag::kWorkspace);
  Tensor tgt_d = Tensor::empty({n}, DType::kI32, d, MemTag::kWorkspace);
  ops::copy(rows_d, Tensor::from_vector(rows, {n}));
  ops::copy(tgt_d, Tensor::from_vector(tgt, {n}));
  Tensor nll = Tensor::empty({n}, wdt, d, MemTag::kWorkspace);
  const int32_t* prow = rows_d.data<int32_t>();
  const int32_t* ptgt = tgt_d.data<int32_t>();

  Tensor zbuf = Tensor::empty({cap, v}, logit_dt, d, MemTag::kWorkspace);
  // opt.stats: the cross-entropy kernels read each chunk's logits twice more (its lse, then the
  // entropy and top-1 per row) before the rows kernel overwrites them with the gradient.
  // The targets are the valid rows' (checked above), copied once as the kernels' i64.
  Tensor st_rows, st_lse, st_ent, st_top, st_tgt;
  const DType sd = stat_dtype(logit_dt);
  if (opt.stats) {
    st_rows = Tensor::empty({cap}, sd, d, MemTag::kWorkspace);
    st_lse = Tensor::empty({cap}, sd, d, MemTag::kWorkspace);
    st_ent = Tensor::empty({n}, sd, d, MemTag::kWorkspace);
    st_top = Tensor::empty({n}, sd, d, MemTag::kWorkspace);
    st_tgt = Tensor::empty({n}, DType::kI64, d, MemTag::kWorkspace);
    ops::copy(st_tgt, Tensor::from_vector(std::vector<int64_t>(tgt.begin(), tgt.end()), {n}));
  }
  Tensor xbuf, dxbuf;
  if (any_gather) xbuf = Tensor::empty({cap, h}, in, d, MemTag::kWorkspace);
  if (any_scatter) dxbuf = Tensor::empty({cap, h}, dx_dt, d, MemTag::kWorkspace);

  // dW accumulator: dweight itself when it is contiguous and A-typed or of the inputs' dtype
  // (cuBLASLt forms alpha G^T X + dW in f32 and rounds once: a 16-bit dW is rounded once per
  // chunk), else an A-typed copy.
  Tensor dw_acc;
  if (dweight.defined()) {
    if ((dweight.dtype() == wdt || dweight.dtype() == in) && dweight.is_contiguous()) {
      dw_acc = dweight;
    } else {
      dw_acc = Tensor::empty(dweight.shape(), wdt, d, MemTag::kWorkspace);
      ops::copy(dw_acc, dweight);
    }
  }

  const double alpha = linear_ce_gemm_alpha(grad_scale);
  for (int64_t c0 = 0; c0 < n; c0 += cap) {
    const int64_t c = std::min(cap, n - c0);
    // X_c: a view of hidden, or gathered rows.
    const void* xc;
    int64_t ldx;
    if (x_in_place(c0, c)) {
      xc = x_view(c0);
      ldx = hr.ld;
    } else {
      linear_ce_gather_launch(hr.ptr, hr.ld, prow + c0, xbuf.data_ptr(), c, h, in, d, stream);
      xc = xbuf.data_ptr();
      ldx = h;
    }
    // Z^T[V,c] = W X_c^T: column-major A = W ([H,V] stored, transposed), B = X_c ([H,c]).
    cu::gemm_cm(wr.ptr, wr.ld, true, xc, ldx, false, zbuf.data_ptr(), v, v, c, h, 1.0, 0.0, in,
                logit_dt, nullptr, d, stream);
    if (opt.stats) {
      const int64_t* yc = st_tgt.data<int64_t>() + c0;
      const size_t off = static_cast<size_t>(c0) * dtype_size(sd);
      cross_entropy_fwd_launch(zbuf.data_ptr(), yc, st_rows.data_ptr(), st_lse.data_ptr(), c, v,
                               logit_dt, stream);
      cross_entropy_row_stats_launch(
          zbuf.data_ptr(), yc, st_lse.data_ptr(), static_cast<char*>(st_ent.data_ptr()) + off,
          static_cast<char*>(st_top.data_ptr()) + off, c, v, logit_dt, stream);
    }
    linear_ce_rows_launch(zbuf.data_ptr(), logit_dt, c, v, ptgt + c0,
                          static_cast<char*>(nll.data_ptr()) + c0 * dtype_size(wdt), grads,
                          opt.softcap, d, stream);
    if (!grads) continue;
    if (dhidden.defined()) {
      // dX_c^T[H,c] = W^T G^T: A = W ([H,V] stored), B = G ([V,c] stored).
      const bool direct = dx_in_place(c0, c);
      void* dx = direct ? dx_view(c0) : dxbuf.data_ptr();
      cu::gemm_cm(wr.ptr, wr.ld, false, zbuf.data_ptr(), v, false, dx, h, h, c, v, alpha, 0.0, in,
                  dx_dt, nullptr, d, stream);
      if (!direct)
        linear_ce_scatter_launch(dxbuf.data_ptr(), dx_dt, prow + c0, dhidden.data_ptr(),
                                 dhidden.dtype(), c, h, d, stream);
    }
    if (dw_acc.defined()) {
      // dW^T[H,V] += X_c^T G: A = X_c ([H,c] stored), B = G ([V,c] stored, transposed).
      cu::gemm_cm(xc, ldx, false, zbuf.data_ptr(), v, true, dw_acc.data_ptr(), h, h, v, c, alpha,
                  1.0, in, dw_acc.dtype(), nullptr, d, stream);
    }
  }
  if (dweight.defined() && !dw_acc.shares_storage(dweight)) ops::copy(dweight, dw_acc);

  // The one synchronisation: the per-row losses, summed in row order in double.
  const std::vector<double> rows_nll = nll.to_f64();
  double loss = 0;
  for (double x : rows_nll) loss += x;
  if (opt.stats) {
    for (double e : st_ent.to_f64()) opt.stats->entropy_sum += e;
    for (double hit : st_top.to_f64()) opt.stats->top1 += hit > 0.5 ? 1 : 0;
  }
  return loss;
}

}  // namespace leantune::kernels
