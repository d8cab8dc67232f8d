// CUDA elementwise ops: add/mul/div (with broadcast), affine, scale_, unary (contract in
// engine/ops_cuda_internal.cuh).
#include "engine/ops_cuda_internal.cuh"

namespace leantune::cuda_ops {
namespace {

// ---------------------------------------------------------------- elementwise

using ops::Bcast;

enum class BinOp : int { kAdd, kMul, kDiv };

template <BinOp kOp, typename A>
__device__ __forceinline__ A binary_apply(A x, A y, A alpha) {
  if constexpr (kOp == BinOp::kAdd)
    return add_rn(x, mul_rn(alpha, y));
  else if constexpr (kOp == BinOp::kMul)
    return mul_rn(x, y);
  else
    return x / y;
}

// out[i] = op(a[i], b[j]) with j = i (same), 0 (scalar) or i % bn (row). out may alias a.
// N elements per step with 16-byte accesses when N > 1 (the host checks alignment).
template <typename T, BinOp kOp, int N>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n, int64_t bn, Bcast kind,
                              acc_of<T> alpha) {
  using A = acc_of<T>;
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const A scalar = kind == Bcast::kScalar ? cu::to_acc(b[0]) : A(0);
  for (int64_t v = tid; v < nvec; v += stride) {
    const int64_t i0 = v * N;
    A x[N], y[N], r[N];
    if constexpr (N > 1) {
      cu::load_vec<T, N>(a + i0, x);
      if (kind == Bcast::kSame) cu::load_vec<T, N>(b + i0, y);
    } else {
      x[0] = cu::to_acc(a[i0]);
      if (kind == Bcast::kSame) y[0] = cu::to_acc(b[i0]);
    }
    if (kind == Bcast::kScalar) {
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = scalar;
    } else if (kind == Bcast::kRow) {
#pragma unroll
      for (int j = 0; j < N; ++j) y[j] = cu::to_acc(b[(i0 + j) % bn]);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = binary_apply<kOp>(x[j], y[j], alpha);
    if constexpr (N > 1)
      cu::store_vec<T, N>(out + i0, r);
    else
      out[i0] = cu::from_acc<T>(r[0]);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    const A y = kind == Bcast::kSame ? cu::to_acc(b[i])
                                     : (kind == Bcast::kScalar ? scalar : cu::to_acc(b[i % bn]));
    out[i] = cu::from_acc<T>(binary_apply<kOp>(cu::to_acc(a[i]), y, alpha));
  }
}

template <BinOp kOp>
void binary_launch(const Tensor& out, const Tensor& a, const Tensor& b, Bcast kind, double alpha) {
  const Device d = a.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const int64_t n = a.numel();
  if (n == 0) return;
  const int64_t bn = std::max<int64_t>(b.numel(), 1);
  LT_CU_DISPATCH_FLOAT(a.dtype(), T, {
    using A = acc_of<T>;
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec =
        cu::aligned16(pa) && cu::aligned16(po) && (kind != Bcast::kSame || cu::aligned16(pb));
    const unsigned blocks = blocks_for(vec ? (n + kVec - 1) / kVec : n, d);
    if (vec)
      binary_kernel<T, kOp, kVec>
          <<<blocks, kThreads, 0, s>>>(pa, pb, po, n, bn, kind, static_cast<A>(alpha));
    else
      binary_kernel<T, kOp, 1>
          <<<blocks, kThreads, 0, s>>>(pa, pb, po, n, bn, kind, static_cast<A>(alpha));
    CUDA_CHECK_LAUNCH();
  });
}

template <BinOp kOp>
Tensor binary_out(const Tensor& a0, const Tensor& b0, double alpha, const char* name) {
  const ops::BinaryOperands o = ops::binary_operands(a0, b0, name, /*in_place=*/false);
  Tensor out = Tensor::empty(o.a.shape(), o.a.dtype(), o.a.device(), current_mem_tag());
  binary_launch<kOp>(out, o.a, o.b, o.kind, alpha);
  return out;
}

template <BinOp kOp>
void binary_inplace(const Tensor& a, const Tensor& b0, double alpha, const char* name) {
  const ops::BinaryOperands o = ops::binary_operands(a, b0, name, /*in_place=*/true);
  binary_launch<kOp>(a, a, o.b, o.kind, alpha);
}

// Unary ops: ops::Unary values, then affine (x * alpha + beta) and scale (x * alpha).
constexpr int kUnaryAffine = 100;
constexpr int kUnaryScale = 101;

template <typename A>
__device__ __forceinline__ A sigmoid_acc(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
  } else {
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
  }
}

template <typename A>
__device__ __forceinline__ A unary_apply(A v, int op, A alpha, A beta) {
  constexpr bool kF = std::is_same_v<A, float>;
  switch (op) {
    case static_cast<int>(ops::Unary::kNeg):
      return -v;
    case static_cast<int>(ops::Unary::kExp):
      if constexpr (kF)
        return expf(v);
      else
        return exp(v);
    case static_cast<int>(ops::Unary::kLog):
      if constexpr (kF)
        return logf(v);
      else
        return log(v);
    case static_cast<int>(ops::Unary::kSigmoid):
      return sigmoid_acc(v);
    case static_cast<int>(ops::Unary::kLogSigmoid):
      if constexpr (kF)
        return v >= 0 ? -log1pf(expf(-v)) : v - log1pf(expf(v));
      else
        return v >= 0 ? -log1p(exp(-v)) : v - log1p(exp(v));
    case static_cast<int>(ops::Unary::kTanh):
      if constexpr (kF)
        return tanhf(v);
      else
        return tanh(v);
    case static_cast<int>(ops::Unary::kRelu):
      return v > 0 ? v : A(0);
    case static_cast<int>(ops::Unary::kSquare):
      return mul_rn(v, v);
    case static_cast<int>(ops::Unary::kSqrt):
      if constexpr (kF)
        return sqrtf(v);
      else
        return sqrt(v);
    case static_cast<int>(ops::Unary::kAbs):
      return fabs(v);
    case static_cast<int>(ops::Unary::kSilu):
      return mul_rn(v, sigmoid_acc(v));
    case kUnaryAffine:
      return add_rn(mul_rn(v, alpha), beta);
    case kUnaryScale:
      return mul_rn(v, alpha);
    default:
      return v;
  }
}

// y[i] = f(x[i]); y may alias x.
template <typename T, int N>
__global__ void unary_kernel(const T* x, T* y, int64_t n, int op, acc_of<T> alpha, acc_of<T> beta) {
  using A = acc_of<T>;
  const int64_t nvec = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t v = tid; v < nvec; v += stride) {
    A r[N];
    if constexpr (N > 1) {
      cu::load_vec<T, N>(x + v * N, r);
#pragma unroll
      for (int j = 0; j < N; ++j) r[j] = unary_apply(r[j], op, alpha, beta);
      cu::store_vec<T, N>(y + v * N, r);
    } else {
      y[v] = cu::from_acc<T>(unary_apply(cu::to_acc(x[v]), op, alpha, beta));
    }
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride)
    y[i] = cu::from_acc<T>(unary_apply(cu::to_acc(x[i]), op, alpha, beta));
}

void unary_launch(const Tensor& y, const Tensor& x, int op, double alpha, double beta) {
  const Device d = x.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const int64_t n = x.numel();
  if (n == 0) return;
  LT_CU_DISPATCH_FLOAT(x.dtype(), T, {
    using A = acc_of<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = cu::aligned16(px) && cu::aligned16(py);
    const unsigned blocks = blocks_for(vec ? (n + kVec - 1) / kVec : n, d);
    if (vec)
      unary_kernel<T, kVec>
          <<<blocks, kThreads, 0, s>>>(px, py, n, op, static_cast<A>(alpha), static_cast<A>(beta));
    else
      unary_kernel<T, 1>
          <<<blocks, kThreads, 0, s>>>(px, py, n, op, static_cast<A>(alpha), static_cast<A>(beta));
    CUDA_CHECK_LAUNCH();
  });
}

Tensor unary_out(const Tensor& x0, int op, double alpha, double beta) {
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device(), current_mem_tag());
  unary_launch(y, x, op, alpha, beta);
  return y;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  return binary_out<BinOp::kAdd>(a, b, alpha, "add");
}
void add_(const Tensor& a, const Tensor& b, double alpha) {
  binary_inplace<BinOp::kAdd>(a, b, alpha, "add_");
}
Tensor mul(const Tensor& a, const Tensor& b) { return binary_out<BinOp::kMul>(a, b, 1.0, "mul"); }
void mul_(const Tensor& a, const Tensor& b) { binary_inplace<BinOp::kMul>(a, b, 1.0, "mul_"); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_out<BinOp::kDiv>(a, b, 1.0, "div"); }

Tensor affine(const Tensor& a, double alpha, double beta) {
  return unary_out(a, kUnaryAffine, alpha, beta);
}
void scale_(const Tensor& a, double s) {
  LT_CHECK(a.is_contiguous(), "scale_ on non-contiguous ", a.str());
  unary_launch(a, a, kUnaryScale, s, 0.0);
}
Tensor unary(const Tensor& x, ops::Unary op) { return unary_out(x, static_cast<int>(op), 0, 0); }

}  // namespace leantune::cuda_ops
