// rope_apply on CUDA: rotary position embedding, rotate_half convention.
//   x:[T, ..., D] (N = numel/(T*D) heads per token), position_ids:[T] i32|i64 (host or device),
//   inv_freq:[R/2] f32 (f64 for f64 x; host or device), R <= D even -> y like x, contiguous.
//   angle = f32(pos) * inv_freq[i] (one f32 product, as transformers' f32 matmul; f64 for f64)
//   c = cos(angle) * scale, s = sin(angle) * scale (the products rounded once, skipped when
//   scale is 1), s negated when `inverse` (the backward rotation)
//   y[i] = x[i] c - x[i+R/2] s,   y[i+R/2] = x[i+R/2] c + x[i] s     (each product rounded)
//   y[j] = x[j] for R <= j < D (partial rotary)
// cos/sin use the accurate sincosf (never the fast __sincosf, which is wrong for the large angles
// of long contexts). y may alias x: each thread reads both halves of its pairs before writing.
// Work split: one block per `tpb` consecutive tokens. Its threads first compute the tokens' cos
// and sin pairs once each into shared memory (tpb x R/2 of each, f32; f64 for f64), then rotate
// every (token, head, group of V frequencies) of those tokens, one group per thread at a time:
// consecutive threads take consecutive groups of a head, so the accesses are coalesced and each
// thread keeps its own loads in flight (a thread does a handful of groups, not every head of a
// token in turn). 16-byte accesses when R/2 is a multiple of V = 16/sizeof(T), D too, and x, y
// are 16-byte aligned. Scratch: the shared cos/sin table only.
#include <algorithm>

#include "engine/cuda_utils.cuh"
#include "kernels/acc_math.cuh"
#include "kernels/rope.h"

namespace leantune::kernels {
namespace {

using cu::add_rn;
using cu::mul_rn;

constexpr int kThreads = 256;
constexpr int kMaxTokensPerBlock = 16;

// Tokens per block: enough frequencies for two per thread in the table phase, at most 16.
int64_t tokens_per_block(int64_t half) {
  return std::clamp<int64_t>(2 * kThreads / half, 1, kMaxTokensPerBlock);
}

// x, y: [T, heads, D] contiguous; pos: i32 (pos32) or i64 (pos64), one of them non-null.
// Dynamic shared memory: 2 * tpb * half accumulators (cos, then sin).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    rope_apply_kernel(const T* x, T* y, const int32_t* pos32, const int64_t* pos64,
                      const cu::acc_of<T>* __restrict__ inv_freq, int64_t tokens, int64_t heads,
                      int64_t half, int64_t d, int64_t tpb, bool inverse, cu::acc_of<T> scale) {
  using A = cu::acc_of<T>;
  extern __shared__ __align__(16) unsigned char rope_smem[];
  A* cos_t = reinterpret_cast<A*>(rope_smem);
  A* sin_t = cos_t + tpb * half;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tpb;
  const int64_t ntok = min(tpb, tokens - t0);
  for (int64_t i = threadIdx.x; i < ntok * half; i += blockDim.x) {
    const int64_t t = t0 + i / half;
    const A p = static_cast<A>(pos64 ? pos64[t] : static_cast<int64_t>(pos32[t]));
    A c, sn;
    libm_sincos(mul_rn(p, inv_freq[i % half]), &sn, &c);
    if (scale != A(1)) {
      sn = mul_rn(sn, scale);
      c = mul_rn(c, scale);
    }
    cos_t[i] = c;
    sin_t[i] = inverse ? -sn : sn;
  }
  __syncthreads();
  const int64_t groups = half / V;
  const int64_t items = ntok * heads * groups;
  for (int64_t it = threadIdx.x; it < items; it += blockDim.x) {
    const int64_t row = it / groups;  // token (within the block) * heads + head
    const int64_t i0 = (it - row * groups) * V;
    const A* c = cos_t + (row / heads) * half + i0;
    const A* sn = sin_t + (row / heads) * half + i0;
    const int64_t off = (t0 * heads + row) * d + i0;
    A a[V], b[V], ya[V], yb[V];
    load_n<T, V>(x + off, a);
    load_n<T, V>(x + off + half, b);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      ya[j] = add_rn(mul_rn(a[j], c[j]), -mul_rn(b[j], sn[j]));
      yb[j] = add_rn(mul_rn(b[j], c[j]), mul_rn(a[j], sn[j]));
    }
    store_n<T, V>(y + off, ya);
    store_n<T, V>(y + off + half, yb);
  }
  const int64_t rest = d - 2 * half;  // partial rotary: the columns past R pass through
  if (rest > 0 && x != y)
    for (int64_t it = threadIdx.x; it < ntok * heads * rest; it += blockDim.x) {
      const int64_t row = it / rest;
      const int64_t k = (t0 * heads + row) * d + 2 * half + (it - row * rest);
      y[k] = x[k];
    }
}

void rope_apply_launch(const void* x, void* y, const void* pos, bool pos64, const void* inv_freq,
                       int64_t tokens, int64_t heads, int64_t half, int64_t d, bool inverse,
                       double scale, DType dt, cudaStream_t stream) {
  if (tokens == 0 || heads == 0 || half == 0) return;
  const int32_t* p32 = pos64 ? nullptr : static_cast<const int32_t*>(pos);
  const int64_t* p64 = pos64 ? static_cast<const int64_t*>(pos) : nullptr;
  const int64_t tpb = tokens_per_block(half);
  const int64_t blocks = (tokens + tpb - 1) / tpb;
  LT_CHECK(blocks < (int64_t{1} << 31), "rope_apply_cuda: too many tokens ", tokens);
  LT_CU_DISPATCH_FLOAT(dt, T, {
    using A = cu::acc_of<T>;
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = half % kVec == 0 && d % kVec == 0 && cu::aligned16(x) && cu::aligned16(y);
    const size_t smem = static_cast<size_t>(2 * tpb * half) * sizeof(A);
    LT_CHECK(smem <= 48 * 1024, "rope_apply_cuda: ", half, " frequencies need ", smem,
             " bytes of shared memory");
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    const A* pf = static_cast<const A*>(inv_freq);
    const auto grid = static_cast<unsigned>(blocks);
    if (vec)
      rope_apply_kernel<T, kVec><<<grid, kThreads, smem, stream>>>(
          px, py, p32, p64, pf, tokens, heads, half, d, tpb, inverse, static_cast<A>(scale));
    else
      rope_apply_kernel<T, 1><<<grid, kThreads, smem, stream>>>(
          px, py, p32, p64, pf, tokens, heads, half, d, tpb, inverse, static_cast<A>(scale));
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rope_apply_cuda(const Tensor& x, const Tensor& position_ids, const Tensor& inv_freq,
                     bool inverse, double scale, const Tensor& y) {
  const char* op = "rope_apply_cuda";
  const Device d = x.device();
  LT_CHECK(d.is_cuda() && x.dim() >= 2 && dtype_is_floating(x.dtype()), op, ": x ", x.str(),
           " must be a [T, ..., D] float tensor on a CUDA device");
  const int64_t t = x.size(0), dim = x.size(-1), half = inv_freq.numel();
  const DType table = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  LT_CHECK(half > 0 && 2 * half <= dim && inv_freq.dtype() == table, op, ": x ", x.str(),
           " needs inv_freq [R/2] with R <= head_dim, ", dtype_name(table), ", got ",
           inv_freq.str());
  LT_CHECK(position_ids.dim() == 1 && position_ids.numel() == t &&
               (position_ids.dtype() == DType::kI32 || position_ids.dtype() == DType::kI64),
           op, ": position_ids ", position_ids.str(), " for x ", x.str());
  cu::check_on(y, d, op, "y");
  cu::check_contiguous(y, op, "y");
  LT_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype(), op, ": y ", y.str(), " for x ",
           x.str());
  LT_CHECK(position_ids.device().is_cpu() || position_ids.device() == d, op, ": position_ids ",
           position_ids.str(), " for x on ", d.str());
  cu::DeviceGuard g(d);
  const Tensor xc = cu::contiguous_ws(x);
  const Tensor pos = cu::on_device_ws(position_ids, d);
  const Tensor inv = cu::on_device_ws(inv_freq, d);
  const int64_t heads = t == 0 || dim == 0 ? 0 : x.numel() / (t * dim);
  rope_apply_launch(xc.data_ptr(), y.data_ptr(), pos.data_ptr(), pos.dtype() == DType::kI64,
                    inv.data_ptr(), t, heads, half, dim, inverse, scale, x.dtype(),
                    cu::stream_of(d));
}

}  // namespace leantune::kernels
