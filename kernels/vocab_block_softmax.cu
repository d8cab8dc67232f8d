// vocab_block_softmax on CUDA: see the header.
//   z:[T,nb] f32|f64, targets:[T] i64 (device), lse/zy:[T] of z's dtype.
// One block of threads per row. The lse update reads the row once (online max and sum, as
// cross_entropy's forward) and merges the block's log-sum-exp into lse[t] with a logaddexp; the
// gradient reads z once and writes dz once (dz may alias z: each element is read before it is
// written by the same thread). Rows are validated on the host by the caller's adapter below.
#include "engine/cuda_utils.cuh"
#include "kernels/acc_math.cuh"
#include "kernels/cross_entropy.h"
#include "kernels/online_softmax.cuh"
#include "kernels/vocab_block_softmax.h"

namespace leantune::kernels {
namespace {

using online::exp_acc;

template <typename A>
__global__ void lse_update_kernel(const A* __restrict__ z, const int64_t* __restrict__ targets,
                                  int64_t nb, int64_t v0, A* __restrict__ lse, A* __restrict__ zy) {
  __shared__ A sm[32], ss[32];
  const int64_t row = blockIdx.x;
  const int64_t y = targets[row];
  if (y == kIgnoreIndex) return;  // uniform over the block: no thread reaches the barriers
  const A* zr = z + row * nb;
  const A b = online::block_row_lse<A, 1>(zr, nb, sm, ss);
  if (threadIdx.x == 0) {
    const A a = lse[row];
    const A hi = fmax(a, b), lo = fmin(a, b);
    lse[row] = lo == A(-INFINITY) ? hi : hi + libm_log(A(1) + exp_acc(lo - hi));
    if (y >= v0 && y < v0 + nb) zy[row] = zr[y - v0];
  }
}

template <typename A>
__global__ void softmax_grad_kernel(const A* z, const int64_t* __restrict__ targets, int64_t nb,
                                    int64_t v0, const A* __restrict__ lse, A scale, A* dz) {
  const int64_t row = blockIdx.x;
  const int64_t y = targets[row];
  const A* zr = z + row * nb;
  A* dr = dz + row * nb;
  if (y == kIgnoreIndex) {
    for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) dr[j] = A(0);
    return;
  }
  const A l = lse[row];
  const int64_t t = y - v0;
  for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) {
    const A p = exp_acc(zr[j] - l);
    dr[j] = (j == t ? p - A(1) : p) * scale;
  }
}

int threads_for(int64_t nb) { return nb >= 4096 ? 512 : nb >= 512 ? 256 : 128; }

void vocab_block_lse_update_launch(const void* z, const int64_t* targets, int64_t rows, int64_t nb,
                                   int64_t v0, void* lse, void* zy, DType dt, cudaStream_t stream) {
  if (rows == 0 || nb == 0) return;
  LT_CHECK(rows < (int64_t{1} << 31), "vocab_block_lse_update: too many rows (", rows, ")");
  const int threads = threads_for(nb);
  if (dt == DType::kF64)
    lse_update_kernel<double><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const double*>(z), targets, nb, v0, static_cast<double*>(lse),
        static_cast<double*>(zy));
  else
    lse_update_kernel<float><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const float*>(z), targets, nb, v0, static_cast<float*>(lse),
        static_cast<float*>(zy));
  CUDA_CHECK_LAUNCH();
}

void vocab_block_softmax_grad_launch(const void* z, const int64_t* targets, int64_t rows,
                                     int64_t nb, int64_t v0, const void* lse, double scale,
                                     void* dz, DType dt, cudaStream_t stream) {
  if (rows == 0 || nb == 0) return;
  LT_CHECK(rows < (int64_t{1} << 31), "vocab_block_softmax_grad: too many rows (", rows, ")");
  const int threads = threads_for(nb);
  if (dt == DType::kF64)
    softmax_grad_kernel<double><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const double*>(z), targets, nb, v0, static_cast<const double*>(lse), scale,
        static_cast<double*>(dz));
  else
    softmax_grad_kernel<float><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const float*>(z), targets, nb, v0, static_cast<const float*>(lse),
        static_cast<float>(scale), static_cast<float*>(dz));
  CUDA_CHECK_LAUNCH();
}

void check_cuda_block(const char* op, const Tensor& z, const Tensor& targets, const Tensor& lse,
                      const Tensor& out, const char* out_name) {
  const Device d = z.device();
  LT_CHECK(d.is_cuda() && z.dim() == 2 && z.is_contiguous() &&
               (z.dtype() == DType::kF32 || z.dtype() == DType::kF64),
           op, ": z ", z.str(), " must be contiguous [T, nb] f32|f64 on a CUDA device");
  cu::check_on(targets, d, op, "targets");
  LT_CHECK(
      targets.dtype() == DType::kI64 && targets.is_contiguous() && targets.numel() == z.size(0), op,
      ": targets ", targets.str(), " for z ", z.str());
  cu::check_operand(lse, d, op, "lse");
  LT_CHECK(lse.dtype() == z.dtype() && lse.numel() == z.size(0), op, ": lse ", lse.str());
  cu::check_operand(out, d, op, out_name);
  LT_CHECK(out.dtype() == z.dtype(), op, ": ", out_name, " ", out.str(), " for z ", z.str());
}

}  // namespace

void vocab_block_lse_update_cuda(const Tensor& z, const Tensor& targets, int64_t v0,
                                 const Tensor& lse, const Tensor& zy) {
  const char* op = "vocab_block_lse_update";
  check_cuda_block(op, z, targets, lse, zy, "zy");
  LT_CHECK(zy.numel() == z.size(0), op, ": zy ", zy.str(), " for z ", z.str());
  cu::DeviceGuard g(z.device());
  vocab_block_lse_update_launch(z.data_ptr(), targets.data<int64_t>(), z.size(0), z.size(1), v0,
                                lse.data_ptr(), zy.data_ptr(), z.dtype(),
                                cu::stream_of(z.device()));
}

void vocab_block_softmax_grad_cuda(const Tensor& z, const Tensor& targets, int64_t v0,
                                   const Tensor& lse, double scale, const Tensor& dz) {
  const char* op = "vocab_block_softmax_grad";
  check_cuda_block(op, z, targets, lse, dz, "dz");
  LT_CHECK(dz.shape() == z.shape() && dz.is_contiguous(), op, ": dz ", dz.str(), " for z ",
           z.str());
  cu::DeviceGuard g(z.device());
  vocab_block_softmax_grad_launch(z.data_ptr(), targets.data<int64_t>(), z.size(0), z.size(1), v0,
                                  lse.data_ptr(), scale, dz.data_ptr(), z.dtype(),
                                  cu::stream_of(z.device()));
}

}  // namespace leantune::kernels
