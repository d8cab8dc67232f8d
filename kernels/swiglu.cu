// The gated MLP activations on CUDA (contract in kernels/swiglu.h): y = act(gate) * up.
//   gate, up, y:[T,I] (any equal shapes), one float dtype (f32, bf16, f16, f64); math in f32
//   (f64 for f64) and one rounding per output, with the CPU path's operation order.
// swiglu: silu(g) = g * s, s = sigmoid(g); y = (g * s) * u
//   Backward: dgate = ((dy * u) * s) * (1 + g * (1 - s)),  dup = (dy * g) * s.
// geglu: t = tanh(b (g + k (g g g))), gelu = (0.5 g) (1 + t); y = gelu * u
//   Backward: dgate = (dy * u) * (0.5 (1 + t) + ((0.5 g) (1 - t t)) b (1 + 3 k g g)),
//   dup = dy * gelu. tanh is the accurate tanhf (tanh for f64).
// Either gradient may be undefined (not needed). One kernel reads g, u, dy once and writes
// dgate and dup.
// sigmoid never exponentiates a positive number (no overflow): x >= 0 ? 1/(1+e^-x) : e^x/(1+e^x).
// The bf16/f16 swiglu forward takes it from the fast intrinsics (__expf, __fdividef: a few f32
// ulp, far below the 16-bit output's half ulp), so that the kernel stays bound by memory rather
// than by the IEEE division (0.65 of the H200's copy rate with it); f32/f64 and the backward keep
// the CPU path's correctly rounded operations.
// Strided inputs are copied to contiguous scratch; outputs must be contiguous. Outputs may alias
// inputs (elementwise: each element is read before it is written, by the same thread).
#include "engine/cuda_utils.cuh"
#include "kernels/acc_math.cuh"
#include "kernels/swiglu.h"

namespace leantune::kernels {
namespace {

using cu::add_rn;
using cu::mul_rn;

constexpr int kThreads = 256;

template <typename A>
__device__ __forceinline__ A sigmoid(A x) {
  if constexpr (std::is_same_v<A, float>) {
    if (x >= 0.0f) return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
    const float e = expf(x);
    return __fdiv_rn(e, __fadd_rn(1.0f, e));
  } else {
    if (x >= 0.0) return __ddiv_rn(1.0, __dadd_rn(1.0, exp(-x)));
    const double e = exp(x);
    return __ddiv_rn(e, __dadd_rn(1.0, e));
  }
}

// sigmoid from the fast intrinsics; e = e^-|x| lies in (0, 1], so nothing overflows.
__device__ __forceinline__ float fast_sigmoid(float x) {
  const float e = __expf(-fabsf(x));
  const float r = __fdividef(1.0f, 1.0f + e);
  return x >= 0.0f ? r : e * r;
}

// act(g) * u in the CPU path's order (kFast: the sigmoid from fast_sigmoid).
template <bool kGelu, typename A, bool kFast = false>
__device__ __forceinline__ A gated_value(A g, A u) {
  if constexpr (!kGelu) {
    if constexpr (kFast && std::is_same_v<A, float>) return mul_rn(mul_rn(g, fast_sigmoid(g)), u);
    return mul_rn(mul_rn(g, sigmoid(g)), u);
  } else {
    const A beta = A(0.7978845608028654), kappa = A(0.044715);
    const A t = libm_tanh(mul_rn(beta, add_rn(g, mul_rn(kappa, mul_rn(mul_rn(g, g), g)))));
    return mul_rn(mul_rn(mul_rn(A(0.5), g), add_rn(A(1), t)), u);
  }
}

template <bool kGelu, typename T, int N>
__global__ void swiglu_fwd_kernel(const T* gate, const T* up, T* y, int64_t n) {
  using A = cu::acc_of<T>;
  constexpr bool kFast = sizeof(T) == 2;
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t v = tid; v < nvec; v += stride) {
    A g[N], u[N];
    cu::load_vec<T, N>(gate + v * N, g);
    cu::load_vec<T, N>(up + v * N, u);
#pragma unroll
    for (int j = 0; j < N; ++j) g[j] = gated_value<kGelu, A, kFast>(g[j], u[j]);
    cu::store_vec<T, N>(y + v * N, g);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride)
    y[i] = cu::from_acc<T>(gated_value<kGelu, A, kFast>(cu::to_acc(gate[i]), cu::to_acc(up[i])));
}

template <bool kGelu, typename A>
__device__ __forceinline__ void swiglu_grads(A g, A u, A d, A* dg, A* du) {
  if constexpr (!kGelu) {
    const A s = sigmoid(g);
    *dg = mul_rn(mul_rn(mul_rn(d, u), s), add_rn(A(1), mul_rn(g, add_rn(A(1), -s))));
    *du = mul_rn(mul_rn(d, g), s);
  } else {
    const A beta = A(0.7978845608028654), kappa = A(0.044715);
    const A t = libm_tanh(mul_rn(beta, add_rn(g, mul_rn(kappa, mul_rn(mul_rn(g, g), g)))));
    const A half_g = mul_rn(A(0.5), g);
    const A slope = add_rn(mul_rn(A(0.5), add_rn(A(1), t)),
                           mul_rn(mul_rn(mul_rn(half_g, add_rn(A(1), -mul_rn(t, t))), beta),
                                  add_rn(A(1), mul_rn(mul_rn(A(3), kappa), mul_rn(g, g)))));
    *dg = mul_rn(mul_rn(d, u), slope);
    *du = mul_rn(d, mul_rn(half_g, add_rn(A(1), t)));
  }
}

template <bool kGelu, typename T, int N>
__global__ void swiglu_bwd_kernel(const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                                  int64_t n) {
  using A = cu::acc_of<T>;
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t v = tid; v < nvec; v += stride) {
    A g[N], u[N], d[N], rg[N], ru[N];
    cu::load_vec<T, N>(gate + v * N, g);
    cu::load_vec<T, N>(up + v * N, u);
    cu::load_vec<T, N>(dy + v * N, d);
#pragma unroll
    for (int j = 0; j < N; ++j) swiglu_grads<kGelu>(g[j], u[j], d[j], &rg[j], &ru[j]);
    if (dgate) cu::store_vec<T, N>(dgate + v * N, rg);
    if (dup) cu::store_vec<T, N>(dup + v * N, ru);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    A rg, ru;
    swiglu_grads<kGelu>(cu::to_acc(gate[i]), cu::to_acc(up[i]), cu::to_acc(dy[i]), &rg, &ru);
    if (dgate) dgate[i] = cu::from_acc<T>(rg);
    if (dup) dup[i] = cu::from_acc<T>(ru);
  }
}

template <bool kGelu>
void swiglu_fwd_launch(const void* gate, const void* up, void* y, int64_t n, DType dt, int device,
                       cudaStream_t stream) {
  if (n == 0) return;
  LT_CU_DISPATCH_FLOAT(dt, T, {
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = cu::aligned16(gate) && cu::aligned16(up) && cu::aligned16(y);
    const unsigned blocks = cu::grid_blocks(vec ? (n + kVec - 1) / kVec : n, kThreads, device);
    const T* pg = static_cast<const T*>(gate);
    const T* pu = static_cast<const T*>(up);
    T* py = static_cast<T*>(y);
    if (vec)
      swiglu_fwd_kernel<kGelu, T, kVec><<<blocks, kThreads, 0, stream>>>(pg, pu, py, n);
    else
      swiglu_fwd_kernel<kGelu, T, 1><<<blocks, kThreads, 0, stream>>>(pg, pu, py, n);
    CUDA_CHECK_LAUNCH();
  });
}

template <bool kGelu>
void swiglu_bwd_launch(const void* dy, const void* gate, const void* up, void* dgate, void* dup,
                       int64_t n, DType dt, int device, cudaStream_t stream) {
  if (n == 0 || (!dgate && !dup)) return;
  LT_CU_DISPATCH_FLOAT(dt, T, {
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = cu::aligned16(dy) && cu::aligned16(gate) && cu::aligned16(up) &&
                     (!dgate || cu::aligned16(dgate)) && (!dup || cu::aligned16(dup));
    const unsigned blocks = cu::grid_blocks(vec ? (n + kVec - 1) / kVec : n, kThreads, device);
    const T* pd = static_cast<const T*>(dy);
    const T* pg = static_cast<const T*>(gate);
    const T* pu = static_cast<const T*>(up);
    T* pdg = static_cast<T*>(dgate);
    T* pdu = static_cast<T*>(dup);
    if (vec)
      swiglu_bwd_kernel<kGelu, T, kVec><<<blocks, kThreads, 0, stream>>>(pd, pg, pu, pdg, pdu, n);
    else
      swiglu_bwd_kernel<kGelu, T, 1><<<blocks, kThreads, 0, stream>>>(pd, pg, pu, pdg, pdu, n);
    CUDA_CHECK_LAUNCH();
  });
}

void check_like(const Tensor& t, const Tensor& ref, Device d, const char* op, const char* name) {
  cu::check_on(t, d, op, name);
  LT_CHECK(t.shape() == ref.shape() && t.dtype() == ref.dtype(), op, ": ", name, " ", t.str(),
           " for gate ", ref.str());
}

template <bool kGelu>
void gated_fwd_cuda(const char* op, const Tensor& gate, const Tensor& up, const Tensor& y) {
  const Device d = gate.device();
  LT_CHECK(d.is_cuda() && dtype_is_floating(gate.dtype()), op, ": gate ", gate.str());
  check_like(up, gate, d, op, "up");
  check_like(y, gate, d, op, "y");
  cu::check_contiguous(y, op, "y");
  cu::DeviceGuard g(d);
  const Tensor gc = cu::contiguous_ws(gate), uc = cu::contiguous_ws(up);
  swiglu_fwd_launch<kGelu>(gc.data_ptr(), uc.data_ptr(), y.data_ptr(), y.numel(), y.dtype(),
                           d.index, cu::stream_of(d));
}

template <bool kGelu>
void gated_bwd_cuda(const char* op, const Tensor& dy, const Tensor& gate, const Tensor& up,
                    const Tensor& dgate, const Tensor& dup) {
  const Device d = gate.device();
  LT_CHECK(d.is_cuda() && dtype_is_floating(gate.dtype()), op, ": gate ", gate.str());
  check_like(up, gate, d, op, "up");
  check_like(dy, gate, d, op, "dy");
  if (dgate.defined()) {
    check_like(dgate, gate, d, op, "dgate");
    cu::check_contiguous(dgate, op, "dgate");
  }
  if (dup.defined()) {
    check_like(dup, gate, d, op, "dup");
    cu::check_contiguous(dup, op, "dup");
  }
  cu::DeviceGuard g(d);
  const Tensor gc = cu::contiguous_ws(gate), uc = cu::contiguous_ws(up), dc = cu::contiguous_ws(dy);
  swiglu_bwd_launch<kGelu>(dc.data_ptr(), gc.data_ptr(), uc.data_ptr(),
                           dgate.defined() ? dgate.data_ptr() : nullptr,
                           dup.defined() ? dup.data_ptr() : nullptr, gate.numel(), gate.dtype(),
                           d.index, cu::stream_of(d));
}

}  // namespace

void swiglu_fwd_cuda(const Tensor& gate, const Tensor& up, const Tensor& y) {
  gated_fwd_cuda<false>("swiglu_fwd_cuda", gate, up, y);
}
void swiglu_bwd_cuda(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup) {
  gated_bwd_cuda<false>("swiglu_bwd_cuda", dy, gate, up, dgate, dup);
}
void geglu_fwd_cuda(const Tensor& gate, const Tensor& up, const Tensor& y) {
  gated_fwd_cuda<true>("geglu_fwd_cuda", gate, up, y);
}
void geglu_bwd_cuda(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                    const Tensor& dup) {
  gated_bwd_cuda<true>("geglu_bwd_cuda", dy, gate, up, dgate, dup);
}

}  // namespace leantune::kernels
