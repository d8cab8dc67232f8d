// CPU implementations of the raw ops and the dispatch to CUDA (engine/ops_cuda_*.cu).
#include "engine/ops.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/cpu_kernels.h"
#include "engine/ops_cuda.h"
#include "engine/ops_shapes.h"

namespace leantune::ops {

using cpu::acc_t;
using cpu::load;
using cpu::parallel_for;
using cpu::store;

namespace {
constexpr int64_t kGrain = 1 << 14;

bool any_cuda(const Tensor& a) { return a.device().is_cuda(); }

// Iterates over a strided tensor: calls f(linear_index, element_offset) in row-major order.
template <typename F>
void for_each_strided(const Shape& shape, const Shape& strides, int64_t base, F&& f) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  if (nd == 0) {
    f(0, base);
    return;
  }
  const int64_t inner = shape[nd - 1];
  const int64_t inner_stride = strides[nd - 1];
  const int64_t outer = n / inner;
  parallel_for(outer, kGrain / std::max<int64_t>(inner, 1), [&](int64_t o) {
    int64_t off = base;
    int64_t rem = o;
    for (int64_t d = nd - 2; d >= 0; --d) {
      off += (rem % shape[d]) * strides[d];
      rem /= shape[d];
    }
    for (int64_t i = 0; i < inner; ++i) f(o * inner + i, off + i * inner_stride);
  });
}

// dst[i] = convert(src[i]) when dst and src are contiguous of dtypes dt and st (words D and S);
// false, with nothing done, otherwise. The f32 <-> bf16 copies of training take this path.
template <typename D, typename S, typename Convert>
bool convert_contiguous(const Tensor& dst, const Tensor& src, DType dt, DType st, Convert convert) {
  if (dst.dtype() != dt || src.dtype() != st || !dst.is_contiguous() || !src.is_contiguous())
    return false;
  auto* d = static_cast<D*>(dst.data_ptr());
  const auto* s = static_cast<const S*>(src.data_ptr());
  parallel_for(dst.numel(), kGrain, [&](int64_t i) { d[i] = convert(s[i]); });
  return true;
}

void cpu_copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  if (convert_contiguous<uint16_t, float>(dst, src, DType::kBF16, DType::kF32,
                                          [](float v) { return f32_to_bf16(v); }))
    return;
  if (convert_contiguous<float, uint16_t>(dst, src, DType::kF32, DType::kBF16,
                                          [](uint16_t v) { return bf16_to_f32(v); }))
    return;
  // General path: gather src into a contiguous buffer of dst's dtype, then scatter.
  (void)src.data_ptr();  // Errors for released memory
  (void)dst.data_ptr();
  const char* sbase = static_cast<const char*>(src.storage()->data());
  char* dbase = static_cast<char*>(dst.storage()->data());
  const Shape dstrides = dst.strides();
  const Shape dshape = dst.shape();
  const int64_t doff = dst.offset();
  LT_DISPATCH_ALL(src.dtype(), S, {
    LT_DISPATCH_ALL(dst.dtype(), D, {
      const S* sp = reinterpret_cast<const S*>(sbase);
      D* dp = reinterpret_cast<D*>(dbase);
      if (dst.is_contiguous()) {
        D* dc = static_cast<D*>(dst.data_ptr());
        for_each_strided(src.shape(), src.strides(), src.offset(), [&](int64_t i, int64_t so) {
          dc[i] = cpu::from_double<D>(cpu::to_double(sp[so]));
        });
      } else {
        Tensor tmp = src.is_contiguous() ? src : src.contiguous();
        const S* sc = static_cast<const S*>(tmp.data_ptr());
        for_each_strided(dshape, dstrides, doff, [&](int64_t i, int64_t dof) {
          dp[dof] = cpu::from_double<D>(cpu::to_double(sc[i]));
        });
      }
    });
  });
}

// out[i] = f(a[i], b[j]) with b broadcast per `kind`; all contiguous, same dtype.
template <typename F>
void cpu_binary(const Tensor& out, const Tensor& a, const Tensor& b, Bcast kind, F f) {
  const int64_t n = a.numel();
  const int64_t bn = std::max<int64_t>(b.numel(), 1);
  LT_DISPATCH_FLOAT(a.dtype(), T, {
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    using A = acc_t<T>;
    if (kind == Bcast::kSame) {
      parallel_for(n, kGrain,
                   [&](int64_t i) { store(po, i, static_cast<A>(f(load(pa, i), load(pb, i)))); });
    } else if (kind == Bcast::kScalar) {
      const A bv = load(pb, 0);
      parallel_for(n, kGrain, [&](int64_t i) { store(po, i, static_cast<A>(f(load(pa, i), bv))); });
    } else {
      parallel_for(n, kGrain, [&](int64_t i) {
        store(po, i, static_cast<A>(f(load(pa, i), load(pb, i % bn))));
      });
    }
  });
}

template <typename F>
Tensor binary_op(const Tensor& a0, const Tensor& b0, const char* name, F f) {
  const BinaryOperands o = binary_operands(a0, b0, name, /*in_place=*/false);
  Tensor out = Tensor::empty(o.a.shape(), o.a.dtype(), o.a.device(), current_mem_tag());
  cpu_binary(out, o.a, o.b, o.kind, f);
  return out;
}

template <typename F>
void binary_inplace(const Tensor& a, const Tensor& b0, const char* name, F f) {
  const BinaryOperands o = binary_operands(a, b0, name, /*in_place=*/true);
  cpu_binary(a, a, o.b, o.kind, f);
}

template <typename F>
Tensor cpu_unary_map(const Tensor& x0, F f) {
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device(), current_mem_tag());
  const int64_t n = x.numel();
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    using A = acc_t<T>;
    parallel_for(n, kGrain, [&](int64_t i) { store(po, i, static_cast<A>(f(load(px, i)))); });
  });
  return out;
}

template <typename A>
A log_sigmoid(A x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}
template <typename A>
A sigmoid(A x) {
  return x >= 0 ? A(1) / (A(1) + std::exp(-x)) : std::exp(x) / (A(1) + std::exp(x));
}
}  // namespace

// ---------------------------------------------------------------- copy / fill

Tensor contiguous_workspace(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  copy(c, t);
  return c;
}

void copy(const Tensor& dst, const Tensor& src) {
  LT_CHECK(dst.shape() == src.shape(), "copy: shapes ", shape_str(dst.shape()), " and ",
           shape_str(src.shape()));
  if (dst.numel() == 0) return;
  if (dst.device().is_cpu() && src.device().is_cpu()) return cpu_copy(dst, src);
  cuda_ops::copy(dst, src);
}

void fill(const Tensor& t, double value) {
  if (t.numel() == 0) return;
  if (any_cuda(t)) return cuda_ops::fill(t, value);
  if (t.is_contiguous()) {
    const int64_t n = t.numel();
    LT_DISPATCH_ALL(t.dtype(), T, {
      T* p = static_cast<T*>(t.data_ptr());
      const T v = cpu::from_double<T>(value);
      parallel_for(n, kGrain, [&](int64_t i) { p[i] = v; });
    });
    return;
  }
  Tensor tmp = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  fill(tmp, value);
  cpu_copy(t, tmp);
}

// ---------------------------------------------------------------- elementwise

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (any_cuda(a)) return cuda_ops::add(a, b, alpha);
  return binary_op(a, b, "add",
                   [alpha](auto x, auto y) { return x + static_cast<decltype(x)>(alpha) * y; });
}
void add_(const Tensor& a, const Tensor& b, double alpha) {
  if (any_cuda(a)) return cuda_ops::add_(a, b, alpha);
  binary_inplace(a, b, "add_",
                 [alpha](auto x, auto y) { return x + static_cast<decltype(x)>(alpha) * y; });
}
Tensor sub(const Tensor& a, const Tensor& b) { return add(a, b, -1.0); }
Tensor mul(const Tensor& a, const Tensor& b) {
  if (any_cuda(a)) return cuda_ops::mul(a, b);
  return binary_op(a, b, "mul", [](auto x, auto y) { return x * y; });
}
void mul_(const Tensor& a, const Tensor& b) {
  if (any_cuda(a)) return cuda_ops::mul_(a, b);
  binary_inplace(a, b, "mul_", [](auto x, auto y) { return x * y; });
}
Tensor div(const Tensor& a, const Tensor& b) {
  if (any_cuda(a)) return cuda_ops::div(a, b);
  return binary_op(a, b, "div", [](auto x, auto y) { return x / y; });
}
Tensor affine(const Tensor& a, double alpha, double beta) {
  if (any_cuda(a)) return cuda_ops::affine(a, alpha, beta);
  return cpu_unary_map(a, [alpha, beta](auto x) {
    using A = decltype(x);
    return x * static_cast<A>(alpha) + static_cast<A>(beta);
  });
}
Tensor scale(const Tensor& a, double s) { return affine(a, s, 0.0); }
void scale_(const Tensor& a, double s) {
  if (any_cuda(a)) return cuda_ops::scale_(a, s);
  LT_CHECK(a.is_contiguous(), "scale_ on non-contiguous ", a.str());
  const int64_t n = a.numel();
  LT_DISPATCH_FLOAT(a.dtype(), T, {
    T* p = static_cast<T*>(a.data_ptr());
    using A = acc_t<T>;
    parallel_for(n, kGrain, [&](int64_t i) { store(p, i, load(p, i) * static_cast<A>(s)); });
  });
}

Tensor unary(const Tensor& x, Unary op) {
  if (any_cuda(x)) return cuda_ops::unary(x, op);
  switch (op) {
    case Unary::kNeg:
      return cpu_unary_map(x, [](auto v) { return -v; });
    case Unary::kExp:
      return cpu_unary_map(x, [](auto v) { return std::exp(v); });
    case Unary::kLog:
      return cpu_unary_map(x, [](auto v) { return std::log(v); });
    case Unary::kSigmoid:
      return cpu_unary_map(x, [](auto v) { return sigmoid(v); });
    case Unary::kLogSigmoid:
      return cpu_unary_map(x, [](auto v) { return log_sigmoid(v); });
    case Unary::kTanh:
      return cpu_unary_map(x, [](auto v) { return std::tanh(v); });
    case Unary::kRelu:
      return cpu_unary_map(x, [](auto v) { return v > 0 ? v : decltype(v)(0); });
    case Unary::kSquare:
      return cpu_unary_map(x, [](auto v) { return v * v; });
    case Unary::kSqrt:
      return cpu_unary_map(x, [](auto v) { return std::sqrt(v); });
    case Unary::kAbs:
      return cpu_unary_map(x, [](auto v) { return std::abs(v); });
    case Unary::kSilu:
      return cpu_unary_map(x, [](auto v) { return v * sigmoid(v); });
  }
  LT_THROW(ErrorKind::kInternal, "unknown unary op");
}

// ---------------------------------------------------------------- reductions

Tensor sum(const Tensor& x0) {
  if (any_cuda(x0)) return cuda_ops::sum(x0);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  double total = 0.0;
  const int64_t n = x.numel();
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    const T* p = static_cast<const T*>(x.data_ptr());
    _Pragma("omp parallel for reduction(+ : total) if (n > kGrain)") for (int64_t i = 0; i < n; ++i)
        total += static_cast<double>(load(p, i));
  });
  const DType out_dt = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  return Tensor::scalar(total, out_dt, x.device());
}

Tensor sum_dim(const Tensor& x0, int64_t dim, bool keepdim) {
  if (any_cuda(x0)) return cuda_ops::sum_dim(x0, dim, keepdim);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const DimReduction r = dim_reduction(x, dim, keepdim, "sum_dim");
  const int64_t outer = r.outer, n = r.n, inner = r.inner;
  Tensor out = Tensor::empty(r.shape, x.dtype(), x.device(), current_mem_tag());
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    const T* p = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    parallel_for(outer * inner, 256, [&](int64_t idx) {
      const int64_t o = idx / inner, i = idx % inner;
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) s += load(p, (o * n + k) * inner + i);
      store(po, idx, static_cast<acc_t<T>>(s));
    });
  });
  return out;
}

namespace {
// max_last and argmax_last on the host: x (made contiguous) as [rows, n];
// reduce_row(p, r, n, out) writes row r's result, p being x's data as its element type. The
// output, of out_dt, drops x's last dimension.
template <typename ReduceRow>
Tensor last_dim_reduce(const Tensor& x0, DType out_dt, MemTag tag, ReduceRow reduce_row) {
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const LastDimRows last = last_dim_rows(x);
  Tensor out = Tensor::empty(last.shape, out_dt, x.device(), tag);
  void* po = out.data_ptr();
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    const T* p = static_cast<const T*>(x.data_ptr());
    parallel_for(last.rows, 64, [&](int64_t r) { reduce_row(p, r, last.n, po); });
  });
  return out;
}
}  // namespace

Tensor max_last(const Tensor& x0) {
  if (any_cuda(x0)) return cuda_ops::max_last(x0);
  return last_dim_reduce(x0, x0.dtype(), current_mem_tag(),
                         [](const auto* p, int64_t r, int64_t n, void* out) {
                           using T = std::remove_cv_t<std::remove_pointer_t<decltype(p)>>;
                           auto m = -std::numeric_limits<acc_t<T>>::infinity();
                           for (int64_t k = 0; k < n; ++k) m = std::max(m, load(p, r * n + k));
                           store(static_cast<T*>(out), r, m);
                         });
}

Tensor argmax_last(const Tensor& x0) {
  if (any_cuda(x0)) return cuda_ops::argmax_last(x0);
  return last_dim_reduce(x0, DType::kI64, MemTag::kOther,
                         [](const auto* p, int64_t r, int64_t n, void* out) {
                           int64_t best = 0;
                           auto m = load(p, r * n);
                           for (int64_t k = 1; k < n; ++k) {
                             auto v = load(p, r * n + k);
                             if (v > m) {  // first maximum wins, like torch.argmax
                               m = v;
                               best = k;
                             }
                           }
                           static_cast<int64_t*>(out)[r] = best;
                         });
}

double sum_squares(const Tensor& x0) {
  if (any_cuda(x0)) return cuda_ops::sum_squares(x0);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  double total = 0.0;
  const int64_t n = x.numel();
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    const T* p = static_cast<const T*>(x.data_ptr());
    _Pragma("omp parallel for reduction(+ : total) if (n > kGrain)") for (int64_t i = 0; i < n;
                                                                          ++i) {
      const double v = load(p, i);
      total += v * v;
    }
  });
  return total;
}

double max_abs(const Tensor& x0) {
  if (any_cuda(x0)) return cuda_ops::max_abs(x0);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  double m = 0.0;
  const int64_t n = x.numel();
  bool nan = false;
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    const T* p = static_cast<const T*>(x.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const double v = std::abs(static_cast<double>(load(p, i)));
      if (std::isnan(v)) nan = true;
      m = std::max(m, v);
    }
  });
  return nan ? std::numeric_limits<double>::quiet_NaN() : m;
}

bool all_finite(const Tensor& x0) {
  if (any_cuda(x0)) return cuda_ops::all_finite(x0);
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const int64_t n = x.numel();
  int bad = 0;
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    const T* p = static_cast<const T*>(x.data_ptr());
    _Pragma("omp parallel for reduction(| : bad) if (n > kGrain)") for (int64_t i = 0; i < n; ++i)
        bad |= !std::isfinite(static_cast<double>(load(p, i)));
  });
  return bad == 0;
}

// ---------------------------------------------------------------- gemm

namespace {
thread_local bool batch_invariant = false;
// Inside the batch-invariant gemm, its tiles run as plain products.
struct BatchInvariantOff {
  bool prev = batch_invariant;
  BatchInvariantOff() { batch_invariant = false; }
  ~BatchInvariantOff() { batch_invariant = prev; }
};
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::kF32 && t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), DType::kF32, t.device(), MemTag::kWorkspace);
  cpu_copy(out, t);
  return out;
}
}  // namespace

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta) {
  const auto [m, k, n] = gemm_dims(a, ta, b, tb, c);
  check_same_device(a, b, "gemm");
  check_same_device(a, c, "gemm");
  if (any_cuda(a)) return cuda_ops::gemm(a, ta, b, tb, c, alpha, beta);
  LT_CHECK(c.is_contiguous(), "gemm output must be contiguous: ", c.str());
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0)
      fill(c, 0.0);
    else
      scale_(c, beta);
    return;
  }
  if (a.dtype() == DType::kF64) {
    LT_CHECK(b.dtype() == DType::kF64 && c.dtype() == DType::kF64, "gemm: mixed f64 inputs");
    Tensor ac = a.contiguous(), bc = b.contiguous();
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, ac.data<double>(), ac.size(1), bc.data<double>(), bc.size(1), beta,
                c.data<double>(), n);
    return;
  }
  Tensor af = as_f32(a), bf = as_f32(b);
  if (batch_invariant && !ta && m > 0) {
    // Tiles of exactly kBatchInvariantRows rows of a, the last one padded with zeros; each
    // tile's product lands in a scratch and its real rows are copied out.
    const int64_t r = kBatchInvariantRows;
    Tensor at = Tensor::zeros({r, k}, DType::kF32, a.device(), MemTag::kWorkspace);
    Tensor ct = Tensor::zeros({r, n}, DType::kF32, c.device(), MemTag::kWorkspace);
    const BatchInvariantOff off;  // the tiles themselves are whole products
    for (int64_t i0 = 0; i0 < m; i0 += r) {
      const int64_t rows = std::min(r, m - i0);
      at.narrow(0, 0, rows).copy_(af.narrow(0, i0, rows));
      if (rows < r) fill(at.narrow(0, rows, r - rows), 0.0);
      if (beta != 0.0) ct.narrow(0, 0, rows).copy_(c.narrow(0, i0, rows));
      gemm(at, false, bf, tb, ct, alpha, beta);
      cpu_copy(c.narrow(0, i0, rows), ct.narrow(0, 0, rows));
    }
    return;
  }
  Tensor cf = c.dtype() == DType::kF32
                  ? c
                  : Tensor::empty(c.shape(), DType::kF32, c.device(), MemTag::kWorkspace);
  if (c.dtype() != DType::kF32 && beta != 0.0) cpu_copy(cf, c);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, static_cast<float>(alpha), af.data<float>(), af.size(1), bf.data<float>(),
              bf.size(1), static_cast<float>(beta), cf.data<float>(), n);
  if (c.dtype() != DType::kF32) cpu_copy(c, cf);
}

BatchInvariantGemmGuard::BatchInvariantGemmGuard() : prev_(batch_invariant) {
  batch_invariant = true;
}
BatchInvariantGemmGuard::~BatchInvariantGemmGuard() { batch_invariant = prev_; }

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, MemTag tag) {
  const int64_t m = ta ? a.size(1) : a.size(0);
  const int64_t n = tb ? b.size(0) : b.size(1);
  Tensor c = Tensor::empty({m, n}, a.dtype(), a.device(), tag);
  gemm(a, ta, b, tb, c, 1.0, 0.0);
  return c;
}

// ---------------------------------------------------------------- softmax

namespace {
template <bool kLog>
Tensor softmax_impl(const Tensor& x0) {
  Tensor x = x0.is_contiguous() ? x0 : x0.contiguous();
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device(), current_mem_tag());
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    const T* p = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    using A = acc_t<T>;
    parallel_for(rows, 16, [&](int64_t r) {
      const int64_t base = r * n;
      A m = -std::numeric_limits<A>::infinity();
      for (int64_t k = 0; k < n; ++k) m = std::max(m, load(p, base + k));
      // The sum in double: a float running sum over a vocabulary row (150k terms) drops the
      // terms below half its ulp, a bias of 1e-4 relative; double keeps f32 within a few ulps.
      double sd = 0;
      for (int64_t k = 0; k < n; ++k) sd += std::exp(load(p, base + k) - m);
      const A s = static_cast<A>(sd);
      if constexpr (kLog) {
        const A lse = m + static_cast<A>(std::log(sd));
        for (int64_t k = 0; k < n; ++k) store(po, base + k, load(p, base + k) - lse);
      } else {
        for (int64_t k = 0; k < n; ++k) store(po, base + k, std::exp(load(p, base + k) - m) / s);
      }
    });
  });
  return out;
}
}  // namespace

Tensor softmax_last(const Tensor& x) {
  if (any_cuda(x)) return cuda_ops::softmax_last(x, false);
  return softmax_impl<false>(x);
}
Tensor log_softmax_last(const Tensor& x) {
  if (any_cuda(x)) return cuda_ops::softmax_last(x, true);
  return softmax_impl<true>(x);
}

Tensor index_rows(const Tensor& table0, const Tensor& ids0) {
  LT_CHECK(table0.dim() == 2 && ids0.dim() == 1, "index_rows: table ", table0.str(), ", ids ",
           ids0.str());
  if (any_cuda(table0)) return cuda_ops::index_rows(table0, ids0);
  Tensor table = table0.contiguous();
  Tensor ids = ids0.dtype() == DType::kI64 ? ids0.contiguous() : ids0.to(DType::kI64);
  const int64_t n = ids.numel(), h = table.size(1), v = table.size(0);
  Tensor out = Tensor::empty({n, h}, table.dtype(), table.device(), current_mem_tag());
  const int64_t* pi = ids.data<int64_t>();
  const size_t row = static_cast<size_t>(h) * table.element_size();
  const char* src = static_cast<const char*>(table.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int64_t i = 0; i < n; ++i)
    LT_CHECK(pi[i] >= 0 && pi[i] < v, "index_rows: id ", pi[i], " out of range [0, ", v, ")");
  parallel_for(n, 64, [&](int64_t i) { std::memcpy(dst + i * row, src + pi[i] * row, row); });
  return out;
}

}  // namespace leantune::ops
