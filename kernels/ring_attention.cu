// Zigzag ring attention's row helpers on CUDA (kernels/ring_attention.h): what the ring driver
// (ring_attention.cpp) does between attention blocks, kept on the device so that a CUDA ring
// makes no host round trip per step.
//   ring_gather_cuda:    src:[T,...] any dtype, rows:[n] i64 -> dst:[n,...] = src[rows[i]]
//   ring_add_rows_cuda:  dst:[T,...] f32 (f64 for f64) += src:[n,...] f32|bf16|f16|f64 at rows
//                        (rows:[n] i64, or undefined for rows 0..n-1)
//   ring_lse_merge_cuda: out:[T,H,D] (f32, or out_b's dtype), lse:[H,T] f32 (f64 for f64) merged
//                        with a partial result over other keys, out_b:[n,H,D], lse_b:[H,n], at rows
// The merge is exact through the log-sum-exp, math in f32 (f64):
//   w = sigmoid(lse_b - lse), out -= w (out - out_b), lse = max + log1p(exp(-|lse - lse_b|)),
// with lse_b = -inf (the partial saw no key) leaving the row alone and lse = -inf taking out_b.
// Row ids come from the ring's layout and are distinct (no two threads write one row) and
// range-checked on the host when built; the kernels still skip an id outside [0, T).
#include "engine/cuda_utils.cuh"
#include "kernels/cuda_device.cuh"
#include "kernels/ring_attention.h"

namespace leantune::kernels {
namespace {

constexpr int kThreads = 256;

// dst[rows[i] * w + c] += src[i * w + c]: elementwise over n * w, rows distinct.
template <typename S, typename A>
__global__ void add_rows_kernel(A* __restrict__ dst, const S* __restrict__ src,
                                const int64_t* __restrict__ rows, int64_t n, int64_t t, int64_t w) {
  const int64_t total = n * w;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / w, c = e % w;
    const int64_t row = rows ? rows[i] : i;
    if (row < 0 || row >= t) continue;
    A* p = dst + row * w + c;
    *p = *p + cu::to_acc(src[e]);
  }
}

// One warp per (partial row i, head h); lanes over head_dim. Every lane reads the old lse before
// lane 0 writes the new one (__syncwarp between).
template <typename O, typename B, typename A>
__global__ void lse_merge_kernel(O* __restrict__ out, A* __restrict__ lse,
                                 const B* __restrict__ out_b, const A* __restrict__ lse_b,
                                 const int64_t* __restrict__ rows, int64_t t, int64_t n,
                                 int64_t h_count, int64_t d) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = blockDim.x >> 5;
  const int64_t pairs = n * h_count;
  for (int64_t p = blockIdx.x * warps + (threadIdx.x >> 5); p < pairs;
       p += static_cast<int64_t>(gridDim.x) * warps) {
    const int64_t i = p / h_count, h = p % h_count;
    const int64_t row = rows ? rows[i] : i;
    if (row < 0 || row >= t) continue;
    const A b = lse_b[h * n + i];
    if (isinf(b) && b < A(0)) continue;  // the partial saw no key
    A* lp = lse + h * t + row;
    const A a = *lp;
    O* orow = out + (row * h_count + h) * d;
    const B* brow = out_b + (i * h_count + h) * d;
    const bool empty = isinf(a) && a < A(0);
    if (empty) {
      for (int64_t c = lane; c < d; c += 32) orow[c] = cu::from_acc<O>(cu::to_acc(brow[c]));
    } else {
      const A w = A(1) / (A(1) + exp(a - b));  // sigmoid(b - a)
      for (int64_t c = lane; c < d; c += 32) {
        const A o = cu::to_acc(orow[c]);
        orow[c] = cu::from_acc<O>(o - w * (o - cu::to_acc(brow[c])));
      }
    }
    __syncwarp();
    if (lane == 0) *lp = empty ? b : (a > b ? a : b) + log1p(exp(-fabs(a - b)));
  }
}

// ---------------------------------------------------------------- launchers (raw pointers)

template <typename S, typename A>
void add_rows_launch(A* dst, const S* src, const int64_t* rows, int64_t n, int64_t t, int64_t w,
                     int device, cudaStream_t stream) {
  if (n == 0 || w == 0) return;
  const unsigned blocks = cu::grid_blocks(n * w, kThreads, device, 4, kThreads);
  add_rows_kernel<S, A><<<blocks, kThreads, 0, stream>>>(dst, src, rows, n, t, w);
  CUDA_CHECK_LAUNCH();
}

template <typename O, typename B, typename A>
void lse_merge_launch(O* out, A* lse, const B* out_b, const A* lse_b, const int64_t* rows,
                      int64_t t, int64_t n, int64_t h, int64_t d, int device, cudaStream_t stream) {
  if (n == 0 || h == 0) return;
  constexpr int kWarps = kThreads / 32;
  const unsigned blocks = cu::grid_blocks(n * h, kWarps, device, 4, kThreads);
  lse_merge_kernel<O, B, A>
      <<<blocks, kThreads, 0, stream>>>(out, lse, out_b, lse_b, rows, t, n, h, d);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- adapters' checks

// rows: undefined, or [n] i64 contiguous on d.
const int64_t* row_ids(const Tensor& rows, int64_t n, Device d, const char* op) {
  if (!rows.defined()) return nullptr;
  cu::check_operand(rows, d, op, "rows");
  cu::check_dtype(rows, DType::kI64, op, "rows");
  LT_CHECK(rows.dim() == 1 && rows.size(0) == n, op, ": rows ", rows.str(), " for ", n,
           " source rows");
  return static_cast<const int64_t*>(rows.data_ptr());
}

// Elements per row of a [T, ...] tensor.
int64_t row_width(const Tensor& t) { return t.size(0) == 0 ? 0 : t.numel() / t.size(0); }

}  // namespace

void ring_gather_cuda(const Tensor& src, const Tensor& rows, const Tensor& dst) {
  const char* op = "ring_gather_cuda";
  const Device d = cuda_device_of(src, op, "src");
  cu::check_operand(src, d, op, "src");
  cu::check_operand(dst, d, op, "dst");
  LT_CHECK(src.dim() >= 1 && dst.dim() == src.dim() && dst.dtype() == src.dtype(), op, ": dst ",
           dst.str(), " for src ", src.str());
  for (int64_t i = 1; i < src.dim(); ++i)
    LT_CHECK(dst.size(i) == src.size(i), op, ": dst ", dst.str(), " for src ", src.str());
  const int64_t n = dst.size(0);
  LT_CHECK(rows.defined(), op, ": rows are undefined");
  const int64_t* ids = row_ids(rows, n, d, op);
  cu::check_index_range(src.numel(), op);
  const int64_t row_bytes = row_width(src) * static_cast<int64_t>(src.element_size());
  if (n == 0 || row_bytes == 0) return;
  cu::DeviceGuard g(d);
  const cudaStream_t s = cu::stream_of(d);
  // The flag is the shared gather's bound guard (a bad id leaves its row unwritten); the ring's
  // ids are checked on the host when built, so it is never read back (no synchronisation).
  cu::BadIndexFlag guard(d, s);
  cu::gather_rows(src.data_ptr(), ids, DType::kI64, dst.data_ptr(), n, src.size(0), row_bytes,
                  src.element_size(), guard.ptr(), d, s);
}

void ring_add_rows_cuda(const Tensor& dst, const Tensor& rows, const Tensor& src) {
  const char* op = "ring_add_rows_cuda";
  const Device d = cuda_device_of(dst, op, "dst");
  cu::check_operand(dst, d, op, "dst");
  cu::check_operand(src, d, op, "src");
  const DType acc = src.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  LT_CHECK(dtype_is_floating(src.dtype()) && dst.dtype() == acc && dst.dim() == src.dim() &&
               dst.dim() >= 1 && row_width(dst) == row_width(src),
           op, ": dst ", dst.str(), " (want ", dtype_name(acc), ") for src ", src.str());
  const int64_t n = src.size(0), t = dst.size(0), w = row_width(src);
  LT_CHECK(rows.defined() || n <= t, op, ": ", n, " source rows for ", t, " destination rows");
  const int64_t* ids = row_ids(rows, n, d, op);
  cu::check_index_range(dst.numel(), op);
  cu::check_index_range(src.numel(), op);
  cu::DeviceGuard g(d);
  const cudaStream_t s = cu::stream_of(d);
  LT_CU_DISPATCH_FLOAT(src.dtype(), S, {
    using A = cu::acc_of<S>;
    add_rows_launch<S, A>(static_cast<A*>(dst.data_ptr()), static_cast<const S*>(src.data_ptr()),
                          ids, n, t, w, d.index, s);
  });
}

void ring_lse_merge_cuda(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                         const Tensor& lse_b, const Tensor& rows) {
  const char* op = "ring_lse_merge_cuda";
  const Device d = cuda_device_of(out, op, "out");
  cu::check_operand(out, d, op, "out");
  cu::check_operand(lse, d, op, "lse");
  cu::check_operand(out_b, d, op, "out_b");
  cu::check_operand(lse_b, d, op, "lse_b");
  const DType acc = out_b.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  LT_CHECK(out.dim() == 3 && out_b.dim() == 3 && out_b.size(1) == out.size(1) &&
               out_b.size(2) == out.size(2) && dtype_is_floating(out_b.dtype()) &&
               (out.dtype() == acc || out.dtype() == out_b.dtype()),
           op, ": out ", out.str(), " and out_b ", out_b.str(),
           " (want [T,H,D] and [n,H,D]; out in f32 or out_b's dtype)");
  const int64_t t = out.size(0), h = out.size(1), dim = out.size(2), n = out_b.size(0);
  cu::check_shape(lse, {h, t}, op, "lse");
  cu::check_shape(lse_b, {h, n}, op, "lse_b");
  cu::check_dtype(lse, acc, op, "lse");
  cu::check_dtype(lse_b, acc, op, "lse_b");
  LT_CHECK(rows.defined() || n == t, op, ": ", n, " partial rows for ", t, " rows need row ids");
  const int64_t* ids = row_ids(rows, n, d, op);
  cu::check_index_range(out.numel(), op);
  cu::check_index_range(out_b.numel(), op);
  cu::DeviceGuard g(d);
  const cudaStream_t s = cu::stream_of(d);
  LT_CU_DISPATCH_FLOAT(out_b.dtype(), B, {
    using A = cu::acc_of<B>;
    A* pl = static_cast<A*>(lse.data_ptr());
    const B* pb = static_cast<const B*>(out_b.data_ptr());
    const A* plb = static_cast<const A*>(lse_b.data_ptr());
    if (out.dtype() == out_b.dtype())
      lse_merge_launch<B, B, A>(static_cast<B*>(out.data_ptr()), pl, pb, plb, ids, t, n, h, dim,
                                d.index, s);
    else
      lse_merge_launch<A, B, A>(static_cast<A*>(out.data_ptr()), pl, pb, plb, ids, t, n, h, dim,
                                d.index, s);
  });
}

}  // namespace leantune::kernels
