// cross_entropy on CUDA.
//   logits:[T,V] (f32, bf16, f16, f64), targets:[T] i32|i64 (host or device; -100 = ignored)
//   forward:  lse[t] = m + log(sum_j exp(z_j - m)) for every row (m = row max), and
//             loss_rows[t] = lse[t] - z[t, y_t], 0 for ignored rows; both [T] f32 (f64 for f64)
//   backward: dlogits[t, j] = exp(z_j - lse[t]) * scale, minus scale at j = y_t (p_y - 1 formed
//             in f32 before the one rounding); zero rows where ignored. dlogits may alias logits.
// Targets are validated on the host before any launch (device targets are copied back for it, a
// stream synchronisation the caller's loss readback would make anyway), so a bad target throws
// (kInput, naming it) with the outputs untouched, as on the CPU path.
// One block per row. The forward reads the row once: each thread keeps an online (max, sum)
// over its 16-byte vectors, the block merges them (merging rescales sums by exp(m_a - m_b), so
// the result equals the two-pass formula up to rounding). The backward reads z once and writes
// dlogits once. f32 math (f64 for f64): exp as exp2f(x log2 e) (a few ulps), logf accurate.
#include "engine/cuda_utils.cuh"
#include "kernels/cross_entropy.h"
#include "kernels/cross_entropy_launch.cuh"
#include "kernels/online_softmax.cuh"
#include "kernels/stat_dtype.h"

namespace leantune::kernels {
namespace {

using online::exp_acc;

// loss_rows and lse for row blockIdx.x; targets are already validated.
template <typename T, int N>
__global__ void cross_entropy_fwd_kernel(const T* __restrict__ logits,
                                         const int64_t* __restrict__ targets, int64_t v,
                                         cu::acc_of<T>* __restrict__ loss_rows,
                                         cu::acc_of<T>* __restrict__ lse) {
  using A = cu::acc_of<T>;
  __shared__ A sm[32], ss[32];
  const int64_t row = blockIdx.x;
  const T* z = logits + row * v;
  const A l = online::block_row_lse<T, N>(z, v, sm, ss);
  if (threadIdx.x == 0) {
    lse[row] = l;
    const int64_t y = targets[row];
    loss_rows[row] = y == kIgnoreIndex ? A(0) : l - cu::to_acc(z[y]);
  }
}

template <typename T, int N>
__global__ void cross_entropy_bwd_kernel(const T* logits, const int64_t* __restrict__ targets,
                                         const cu::acc_of<T>* __restrict__ lse, int64_t v,
                                         cu::acc_of<T> scale, T* dlogits) {
  using A = cu::acc_of<T>;
  const int64_t row = blockIdx.x;
  const T* z = logits + row * v;
  T* d = dlogits + row * v;
  const int64_t y = targets[row];
  const int64_t nvec = v / N;
  if (y == kIgnoreIndex) {
    A zero[N];
#pragma unroll
    for (int j = 0; j < N; ++j) zero[j] = 0;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      if constexpr (N > 1) {
        cu::store_vec<T, N>(d + k * N, zero);
      } else {
        d[k] = cu::from_acc<T>(zero[0]);
      }
    }
    for (int64_t j = nvec * N + threadIdx.x; j < v; j += blockDim.x) d[j] = cu::from_acc<T>(A(0));
    return;
  }
  const A l = lse[row];
  auto grad = [&](A zj, int64_t j) {
    const A p = exp_acc(zj - l);
    return j == y ? cu::mul_rn(p - A(1), scale) : cu::mul_rn(p, scale);
  };
  for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
    A x[N];
    if constexpr (N > 1) {
      cu::load_vec<T, N>(z + k * N, x);
    } else {
      x[0] = cu::to_acc(z[k]);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] = grad(x[j], k * N + j);
    if constexpr (N > 1) {
      cu::store_vec<T, N>(d + k * N, x);
    } else {
      d[k] = cu::from_acc<T>(x[0]);
    }
  }
  for (int64_t j = nvec * N + threadIdx.x; j < v; j += blockDim.x)
    d[j] = cu::from_acc<T>(grad(cu::to_acc(z[j]), j));
}

// entropy and top-1 hit of row blockIdx.x (see cross_entropy.h): each thread keeps a partial
// sum of p_j z_j and its first maximum; warps merge by shuffles, then warp 0 merges the warps in
// order (deterministic). Ties keep the smaller index, as torch.argmax does.
template <typename T>
__global__ void cross_entropy_row_stats_kernel(const T* __restrict__ logits,
                                               const int64_t* __restrict__ targets,
                                               const cu::acc_of<T>* __restrict__ lse, int64_t v,
                                               cu::acc_of<T>* __restrict__ entropy,
                                               cu::acc_of<T>* __restrict__ top1) {
  using A = cu::acc_of<T>;
  __shared__ A s_sum[32], s_best[32];
  __shared__ int64_t s_arg[32];
  const int64_t row = blockIdx.x;
  const T* z = logits + row * v;
  const A l = lse[row];
  A sum = 0, best = A(-INFINITY);
  int64_t arg = v;  // none yet
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    const A zj = cu::to_acc(z[j]);
    sum += exp_acc(zj - l) * zj;
    if (zj > best || arg == v) {
      best = zj;
      arg = j;
    }
  }
  // Whether (b2, a2) beats (b1, a1): a larger value, or an equal one at a smaller index; an
  // index of INT64_MAX stands for "no element" (a thread past the row's end).
  auto better = [](A b1, int64_t a1, A b2, int64_t a2) {
    if (a2 == INT64_MAX) return false;
    if (a1 == INT64_MAX) return true;
    return b2 > b1 || (b2 == b1 && a2 < a1);
  };
  if (arg == v) arg = INT64_MAX;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A osum = __shfl_xor_sync(0xffffffffu, sum, o);
    const A obest = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oarg = __shfl_xor_sync(0xffffffffu, arg, o);
    sum += osum;
    if (better(best, arg, obest, oarg)) {
      best = obest;
      arg = oarg;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s_sum[warp] = sum;
    s_best[warp] = best;
    s_arg[warp] = arg;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  A tsum = 0, tbest = A(-INFINITY);
  int64_t targ = INT64_MAX;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    tsum += s_sum[w];
    if (better(tbest, targ, s_best[w], s_arg[w])) {
      tbest = s_best[w];
      targ = s_arg[w];
    }
  }
  entropy[row] = l - tsum;
  const int64_t y = targets[row];
  top1[row] = y != kIgnoreIndex && targ == y ? A(1) : A(0);
}

int block_threads(int64_t nvec) {
  if (nvec >= 8192) return 512;
  if (nvec >= 1024) return 256;
  return 128;
}

}  // namespace

void cross_entropy_fwd_launch(const void* logits, const int64_t* targets, void* loss_rows,
                              void* lse, int64_t rows, int64_t v, DType dt, cudaStream_t stream) {
  if (rows == 0) return;
  LT_CU_DISPATCH_FLOAT(dt, T, {
    using A = cu::acc_of<T>;
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = v % kVec == 0 && cu::aligned16(logits);
    const int threads = block_threads(vec ? v / kVec : v);
    const T* pz = static_cast<const T*>(logits);
    A* pl = static_cast<A*>(loss_rows);
    A* pe = static_cast<A*>(lse);
    if (vec)
      cross_entropy_fwd_kernel<T, kVec>
          <<<static_cast<unsigned>(rows), threads, 0, stream>>>(pz, targets, v, pl, pe);
    else
      cross_entropy_fwd_kernel<T, 1>
          <<<static_cast<unsigned>(rows), threads, 0, stream>>>(pz, targets, v, pl, pe);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_bwd_launch(const void* logits, const int64_t* targets, const void* lse,
                              double scale, void* dlogits, int64_t rows, int64_t v, DType dt,
                              cudaStream_t stream) {
  if (rows == 0) return;
  LT_CU_DISPATCH_FLOAT(dt, T, {
    using A = cu::acc_of<T>;
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = v % kVec == 0 && cu::aligned16(logits) && cu::aligned16(dlogits);
    const int threads = block_threads(vec ? v / kVec : v);
    const T* pz = static_cast<const T*>(logits);
    const A* pe = static_cast<const A*>(lse);
    T* pd = static_cast<T*>(dlogits);
    if (vec)
      cross_entropy_bwd_kernel<T, kVec><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
          pz, targets, pe, v, static_cast<A>(scale), pd);
    else
      cross_entropy_bwd_kernel<T, 1><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
          pz, targets, pe, v, static_cast<A>(scale), pd);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_row_stats_launch(const void* logits, const int64_t* targets, const void* lse,
                                    void* entropy, void* top1, int64_t rows, int64_t v, DType dt,
                                    cudaStream_t stream) {
  if (rows == 0) return;
  LT_CU_DISPATCH_FLOAT(dt, T, {
    using A = cu::acc_of<T>;
    const int threads = block_threads(v);
    cross_entropy_row_stats_kernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const T*>(logits), targets, static_cast<const A*>(lse), v,
        static_cast<A*>(entropy), static_cast<A*>(top1));
    CUDA_CHECK_LAUNCH();
  });
}

namespace {

// The logits' device and [rows, v] shape, after checking logits and targets.
struct Inputs {
  Device d;
  int64_t rows, v;
};

Inputs check_inputs(const char* op, const Tensor& logits, const Tensor& targets) {
  LT_CHECK(logits.device().is_cuda() && logits.dim() == 2 && logits.size(1) > 0 &&
               dtype_is_floating(logits.dtype()),
           op, ": logits ", logits.str(), " must be [T, V] float on a CUDA device, V > 0");
  LT_CHECK(targets.dim() == 1 && targets.numel() == logits.size(0) &&
               (targets.dtype() == DType::kI32 || targets.dtype() == DType::kI64),
           op, ": targets ", targets.str(), " for logits ", logits.str());
  LT_CHECK(targets.device().is_cpu() || targets.device() == logits.device(), op, ": targets ",
           targets.str(), " for logits on ", logits.device().str());
  LT_CHECK(logits.size(0) < (int64_t{1} << 31), op, ": too many rows in ", logits.str());
  return {logits.device(), logits.size(0), logits.size(1)};
}

// Targets checked on the host with the CPU path's message, then as i64 on the device.
Tensor checked_targets(const Tensor& targets, int64_t v, Device d, const char* op) {
  std::vector<int64_t> y = targets.to_i64();
  for (size_t t = 0; t < y.size(); ++t)
    LT_CHECK_INPUT(y[t] == kIgnoreIndex || (y[t] >= 0 && y[t] < v), op, ": target ", y[t],
                   " at position ", t, " is outside the vocabulary [0, ", v,
                   ") and is not the ignore index ", kIgnoreIndex);
  if (targets.device() == d && targets.dtype() == DType::kI64) return cu::contiguous_ws(targets);
  Tensor out = Tensor::empty(targets.shape(), DType::kI64, d, MemTag::kWorkspace);
  ops::copy(out, Tensor::from_vector(y, targets.shape()));
  return out;
}

}  // namespace

void cross_entropy_fwd_cuda(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows,
                            const Tensor& lse) {
  const char* op = "cross_entropy";
  const auto [d, rows, v] = check_inputs(op, logits, targets);
  const DType sd = stat_dtype(logits.dtype());
  cu::check_operand(loss_rows, d, op, "loss_rows");
  cu::check_operand(lse, d, op, "lse");
  LT_CHECK(loss_rows.shape() == (Shape{rows}) && loss_rows.dtype() == sd &&
               lse.shape() == (Shape{rows}) && lse.dtype() == sd,
           op, ": loss_rows ", loss_rows.str(), ", lse ", lse.str(), " for logits ", logits.str());
  cu::DeviceGuard g(d);
  const Tensor y = checked_targets(targets, v, d, op);
  const Tensor zc = cu::contiguous_ws(logits);
  cross_entropy_fwd_launch(zc.data_ptr(), y.data<int64_t>(), loss_rows.data_ptr(), lse.data_ptr(),
                           rows, v, logits.dtype(), cu::stream_of(d));
}

void cross_entropy_bwd_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, const Tensor& dlogits) {
  const char* op = "cross_entropy_bwd";
  const auto [d, rows, v] = check_inputs(op, logits, targets);
  cu::check_on(lse, d, op, "lse");
  LT_CHECK(lse.shape() == (Shape{rows}) && lse.dtype() == stat_dtype(logits.dtype()), op, ": lse ",
           lse.str(), " for logits ", logits.str());
  cu::check_operand(dlogits, d, op, "dlogits");
  LT_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype(), op, ": dlogits ",
           dlogits.str(), " for logits ", logits.str());
  cu::DeviceGuard g(d);
  const Tensor y = checked_targets(targets, v, d, op);
  const Tensor zc = cu::contiguous_ws(logits), ec = cu::contiguous_ws(lse);
  cross_entropy_bwd_launch(zc.data_ptr(), y.data<int64_t>(), ec.data_ptr(), scale,
                           dlogits.data_ptr(), rows, v, logits.dtype(), cu::stream_of(d));
}

void cross_entropy_row_stats_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  const Tensor& entropy, const Tensor& top1) {
  const char* op = "cross_entropy_row_stats";
  const auto [d, rows, v] = check_inputs(op, logits, targets);
  const DType sd = stat_dtype(logits.dtype());
  cu::check_on(lse, d, op, "lse");
  cu::check_operand(entropy, d, op, "entropy");
  cu::check_operand(top1, d, op, "top1");
  for (const Tensor* t : {&lse, &entropy, &top1})
    LT_CHECK(t->shape() == (Shape{rows}) && t->dtype() == sd, op, ": ", t->str(), " for logits ",
             logits.str());
  cu::DeviceGuard g(d);
  const Tensor y = checked_targets(targets, v, d, op);
  const Tensor zc = cu::contiguous_ws(logits), ec = cu::contiguous_ws(lse);
  cross_entropy_row_stats_launch(zc.data_ptr(), y.data<int64_t>(), ec.data_ptr(),
                                 entropy.data_ptr(), top1.data_ptr(), rows, v, logits.dtype(),
                                 cu::stream_of(d));
}

}  // namespace leantune::kernels
