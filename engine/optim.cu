// adamw_step_cuda: the fused multi-tensor AdamW update of engine/optim.h on the device.
//   per element, in f32, with the CPU path's operation order and constants (so results match it
//   bit for bit: every product, sum, quotient and sqrt is IEEE-rounded, nothing is fused):
//     g = grad * grad_scale
//     m = b1 m + (1 - b1) g;   v = b2 v + ((1 - b2) g) g
//     w = (master or param) * (1 - lr wd)
//     w = w - (step_size m) / (sqrt(v) / sqrt(bc2) + eps),   step_size = lr / bc1
//     master = w (when present); param = round(w) to its dtype
//   param: f32, bf16 or f16 (contiguous); grad: any float dtype, same numel; master (optional),
//   exp_avg, exp_avg_sq: f32. All tensors on one device. f64 parameters are CPU-only.
// Multi-tensor apply (after apex): tensors are cut into 64K-element chunks, one block per chunk;
// a launch carries up to kMaxTensors whole tensors (pointers and the first block of each, < 4 KB
// of kernel arguments) and as many blocks as their chunks, so that a launch is many full waves
// and a whole model takes a few launches; each block finds its tensor by a binary search over
// the first blocks. Each element is read and written exactly once. Tensors are grouped by
// (param, grad) dtype, one kernel instantiation each. 4-element vector accesses when a tensor's
// pointers allow.
#include <cmath>
#include <map>
#include <utility>

#include "engine/cuda_utils.cuh"
#include "engine/optim.h"

namespace leantune {
namespace {

constexpr int kMaxTensors = 60;
constexpr int64_t kChunk = 65536;
constexpr int kThreads = 512;
constexpr int kVec = 4;

struct TensorArgs {
  void* param;
  const void* grad;
  float* master;  // nullptr: the parameter itself is the value updated
  float* m;
  float* v;
  int64_t n;
  float decay;  // 1 - lr * weight_decay
  int32_t vec;  // all pointers allow kVec-element accesses
};

struct LaunchArgs {
  TensorArgs t[kMaxTensors];
  int32_t first_block[kMaxTensors + 1];  // tensor k's chunks are blocks [first_block[k], [k + 1])
  int32_t ntensors;
};
static_assert(sizeof(LaunchArgs) <= 4000, "kernel arguments must stay under 4 KB");

struct Scalars {
  float b1, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps, grad_scale;
};

template <typename P, typename G>
__device__ __forceinline__ void adamw_element(const TensorArgs& t, const Scalars& s, float g_raw,
                                              float& m, float& v, float& w) {
  const float g = __fmul_rn(g_raw, s.grad_scale);
  m = __fadd_rn(__fmul_rn(s.b1, m), __fmul_rn(s.one_minus_b1, g));
  v = __fadd_rn(__fmul_rn(s.b2, v), __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
  w = __fmul_rn(w, t.decay);
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  w = __fsub_rn(w, __fdiv_rn(__fmul_rn(s.step_size, m), denom));
}

// Element k of tensor t, read and written back one value at a time.
template <typename P, typename G>
__device__ __forceinline__ void adamw_at(const TensorArgs& t, const Scalars& s, P* param,
                                         const G* grad, int64_t k) {
  float m = t.m[k], v = t.v[k];
  float w = t.master ? t.master[k] : cu::to_acc(param[k]);
  adamw_element<P, G>(t, s, static_cast<float>(cu::to_acc(grad[k])), m, v, w);
  t.m[k] = m;
  t.v[k] = v;
  if (t.master) t.master[k] = w;
  param[k] = cu::from_acc<P>(w);
}

// kVec elements' gradient, moments and weight in registers.
struct Lane {
  float g[kVec], m[kVec], v[kVec], w[kVec];
};

template <typename P, typename G>
__device__ __forceinline__ void load_lane(const TensorArgs& t, const P* param, const G* grad,
                                          int64_t i, Lane& x) {
  cu::load_vec<G, kVec>(grad + i, x.g);
  const float4 m4 = *reinterpret_cast<const float4*>(t.m + i);
  const float4 v4 = *reinterpret_cast<const float4*>(t.v + i);
  x.m[0] = m4.x, x.m[1] = m4.y, x.m[2] = m4.z, x.m[3] = m4.w;
  x.v[0] = v4.x, x.v[1] = v4.y, x.v[2] = v4.z, x.v[3] = v4.w;
  if (t.master) {
    const float4 w4 = *reinterpret_cast<const float4*>(t.master + i);
    x.w[0] = w4.x, x.w[1] = w4.y, x.w[2] = w4.z, x.w[3] = w4.w;
  } else {
    cu::load_vec<P, kVec>(param + i, x.w);
  }
}

template <typename P, typename G>
__device__ __forceinline__ void update_store_lane(const TensorArgs& t, const Scalars& s, P* param,
                                                  int64_t i, Lane& x) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) adamw_element<P, G>(t, s, x.g[j], x.m[j], x.v[j], x.w[j]);
  *reinterpret_cast<float4*>(t.m + i) = make_float4(x.m[0], x.m[1], x.m[2], x.m[3]);
  *reinterpret_cast<float4*>(t.v + i) = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
  if (t.master)
    *reinterpret_cast<float4*>(t.master + i) = make_float4(x.w[0], x.w[1], x.w[2], x.w[3]);
  cu::store_vec<P, kVec>(param + i, x.w);
}

// Vectorised, two vectors per thread at a time: both are loaded before either is stored (the
// compiler may not move a load above a store to memory it cannot prove apart), so each thread
// keeps two vectors' reads in flight.
template <typename P, typename G>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const __grid_constant__ LaunchArgs args, Scalars s) {
  const int32_t block = static_cast<int32_t>(blockIdx.x);
  int lo = 0, hi = args.ntensors - 1;  // the last tensor whose first block is <= this one
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (args.first_block[mid] <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  const TensorArgs& t = args.t[lo];
  const int64_t start = static_cast<int64_t>(block - args.first_block[lo]) * kChunk;
  const int64_t end = min(t.n, start + kChunk);
  P* param = static_cast<P*>(t.param);
  const G* grad = static_cast<const G*>(t.grad);
  int64_t i = start + static_cast<int64_t>(threadIdx.x) * kVec;
  if (t.vec) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
    for (; i + stride + kVec <= end; i += 2 * stride) {
      Lane a, b;
      load_lane<P, G>(t, param, grad, i, a);
      load_lane<P, G>(t, param, grad, i + stride, b);
      update_store_lane<P, G>(t, s, param, i, a);
      update_store_lane<P, G>(t, s, param, i + stride, b);
    }
    for (; i + kVec <= end; i += stride) {
      Lane a;
      load_lane<P, G>(t, param, grad, i, a);
      update_store_lane<P, G>(t, s, param, i, a);
    }
    // The tail of a chunk that is not a multiple of kVec (only a tensor's last chunk).
    for (int64_t k = i; k < end; ++k) adamw_at<P, G>(t, s, param, grad, k);
    return;
  }
  for (int64_t k = start + threadIdx.x; k < end; k += blockDim.x) {
    adamw_at<P, G>(t, s, param, grad, k);
  }
}

template <typename P, typename G>
void adamw_launch(const LaunchArgs& args, int blocks, const Scalars& s, cudaStream_t stream) {
  adamw_kernel<P, G><<<blocks, kThreads, 0, stream>>>(args, s);
  CUDA_CHECK_LAUNCH();
}

void launch_group(DType pdt, DType gdt, const LaunchArgs& args, int blocks, const Scalars& s,
                  cudaStream_t stream) {
  LT_CU_DISPATCH_F32_16(
      pdt, P, { LT_CU_DISPATCH_FLOAT(gdt, G, { adamw_launch<P, G>(args, blocks, s, stream); }); });
}

bool aligned_to(const void* p, size_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

void check_tensor(const AdamWTensor& t, Device d) {
  const char* op = "adamw_step_cuda";
  cu::check_operand(t.param, d, op, "param");
  cu::check_operand(t.grad, d, op, "grad");
  cu::check_operand(t.exp_avg, d, op, "exp_avg");
  cu::check_operand(t.exp_avg_sq, d, op, "exp_avg_sq");
  const int64_t n = t.param.numel();
  LT_CHECK(t.param.dtype() == DType::kF32 || t.param.dtype() == DType::kBF16 ||
               t.param.dtype() == DType::kF16,
           op, ": param ", t.param.str(), " (f64 parameters are updated on the host)");
  LT_CHECK(dtype_is_floating(t.grad.dtype()) && t.grad.numel() == n, op, ": grad ", t.grad.str(),
           " for param ", t.param.str());
  cu::check_dtype(t.exp_avg, DType::kF32, op, "exp_avg");
  cu::check_dtype(t.exp_avg_sq, DType::kF32, op, "exp_avg_sq");
  LT_CHECK(t.exp_avg.numel() == n && t.exp_avg_sq.numel() == n, op, ": state ", t.exp_avg.str(),
           " for param ", t.param.str());
  if (t.master.defined()) {
    cu::check_operand(t.master, d, op, "master");
    cu::check_dtype(t.master, DType::kF32, op, "master");
    LT_CHECK(t.master.numel() == n, op, ": master ", t.master.str(), " for ", t.param.str());
  }
}

}  // namespace

void adamw_step_cuda(const std::vector<AdamWTensor>& tensors, const AdamWStepArgs& a) {
  if (tensors.empty()) return;
  const Device d = tensors[0].param.device();
  LT_CHECK(d.is_cuda(), "adamw_step_cuda: param ", tensors[0].param.str(), " is on the host");
  for (const AdamWTensor& t : tensors) check_tensor(t, d);
  LT_CHECK(a.step >= 1, "adamw_step_cuda: step ", a.step, " (1-based)");
  cu::DeviceGuard g(d);
  cudaStream_t stream = cu::stream_of(d);

  // The constants exactly as the CPU path forms them (double, then one rounding to f32).
  Scalars s;
  s.b1 = static_cast<float>(a.beta1);
  s.b2 = static_cast<float>(a.beta2);
  s.one_minus_b1 = 1.0f - s.b1;
  s.one_minus_b2 = 1.0f - s.b2;
  const float bc1 = static_cast<float>(1.0 - std::pow(a.beta1, static_cast<double>(a.step)));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(a.beta2, static_cast<double>(a.step))));
  s.step_size = static_cast<float>(a.lr) / bc1;
  s.eps = static_cast<float>(a.eps);
  s.grad_scale = static_cast<float>(a.grad_scale);

  std::map<std::pair<DType, DType>, std::vector<const AdamWTensor*>> groups;
  for (const AdamWTensor& t : tensors)
    if (t.param.numel() > 0) groups[{t.param.dtype(), t.grad.dtype()}].push_back(&t);

  for (const auto& [key, list] : groups) {
    LaunchArgs args{};
    int64_t nblocks = 0;
    auto flush = [&] {
      if (args.ntensors > 0)
        launch_group(key.first, key.second, args, static_cast<int>(nblocks), s, stream);
      args.ntensors = 0;
      nblocks = 0;
    };
    for (const AdamWTensor* t : list) {
      const int64_t n = t->param.numel();
      const int64_t chunks = (n + kChunk - 1) / kChunk;
      LT_CHECK(chunks < (int64_t{1} << 30), "adamw_step_cuda: tensor too large ", t->param.str());
      if (args.ntensors == kMaxTensors || nblocks + chunks >= (int64_t{1} << 31)) flush();
      TensorArgs& ta = args.t[args.ntensors];
      ta.param = t->param.data_ptr();
      ta.grad = t->grad.data_ptr();
      ta.master = t->master.defined() ? t->master.data<float>() : nullptr;
      ta.m = t->exp_avg.data<float>();
      ta.v = t->exp_avg_sq.data<float>();
      ta.n = n;
      ta.decay = static_cast<float>(1.0 - a.lr * t->weight_decay);
      ta.vec = aligned_to(ta.param, kVec * t->param.element_size()) &&
               aligned_to(ta.grad, kVec * t->grad.element_size()) && aligned_to(ta.master, 16) &&
               aligned_to(ta.m, 16) && aligned_to(ta.v, 16);
      args.first_block[args.ntensors++] = static_cast<int32_t>(nblocks);
      nblocks += chunks;
      args.first_block[args.ntensors] = static_cast<int32_t>(nblocks);
    }
    flush();
  }
}

}  // namespace leantune
