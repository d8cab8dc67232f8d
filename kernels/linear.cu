// linear on CUDA, through cuBLASLt (engine/cuda_blas.cuh).
//   x:[T,in], W:[out,in], b:[out] or undefined -> y:[T,out] contiguous; one float dtype.
//   forward:  y = x W^T + b   one GEMM, bias added in the epilogue (f32 accumulate, one rounding)
//   backward: dx = dy W       one GEMM
//             dW = dy^T x     one GEMM (dW may be f32 for 16-bit x: cuBLASLt writes f32 directly)
//             db = column sums of dy, f32 accumulation in a fixed order (cu::column_sum)
// bf16/f16 inputs accumulate in f32; f32 is strict f32 (no TF32), f64 goes through cublasDgemm
// (then the bias is a separate broadcast add). Any of dx, dW, db may be undefined; dW and db are
// overwritten. Inputs with unit inner stride are used in place (leading dimension = row stride);
// others are copied. cuBLASLt's workspace comes from the caching allocator (kWorkspace).
// Column-major view used for every call: a row-major [r,c] matrix is a column-major [c,r] one, so
//   y^T[out,T]  = W[in,out]^T * x^T[in,T]        (A = W transposed, B = x)
//   dx^T[in,T]  = W^T[in,out] * dy^T[out,T]       (A = W, B = dy)
//   dW^T[in,out] = x^T[in,T] * (dy^T[out,T])^T    (A = x, B = dy transposed)
#include "engine/cuda_blas.cuh"
#include "engine/cuda_utils.cuh"
#include "engine/profile.h"
#include "kernels/linear.h"

namespace leantune::kernels {
namespace {

// A 2-D operand with unit inner stride: pointer and leading dimension (elements between rows).
struct Rows {
  Tensor keep;
  const void* ptr = nullptr;
  int64_t ld = 0;
};

Rows as_rows(const Tensor& t, DType want) {
  Rows r;
  const int64_t rows = t.size(0), cols = t.size(1);
  if (t.dtype() == want && (t.strides()[1] == 1 || cols == 1) &&
      (rows == 1 || t.strides()[0] >= cols)) {
    r.keep = t;
    r.ptr = t.data_ptr();
    r.ld = rows == 1 ? std::max<int64_t>(cols, 1) : std::max<int64_t>(t.strides()[0], 1);
    return r;
  }
  r.keep = Tensor::empty(t.shape(), want, t.device(), MemTag::kWorkspace);
  ops::copy(r.keep, t);
  r.ptr = r.keep.data_ptr();
  r.ld = std::max<int64_t>(cols, 1);
  return r;
}

// D[m,n] (column-major, ld m) = op(A) op(B) (+ bias), with f64 routed to cublasDgemm.
void gemm_launch(const Rows& a, bool ta, const Rows& b, bool tb, void* d, DType d_type, int64_t m,
                 int64_t n, int64_t k, const void* bias, DType in_type, Device dev,
                 cudaStream_t stream) {
  cu::gemm_cm(a.ptr, a.ld, ta, b.ptr, b.ld, tb, d, m, m, n, k, 1.0, 0.0, in_type, d_type, bias, dev,
              stream);
}

void check_grad_out(const Tensor& t, const Shape& s, DType dt, Device d, const char* op,
                    const char* name) {
  cu::check_operand(t, d, op, name);
  LT_CHECK(t.shape() == s, op, ": ", name, " ", t.str(), " must have shape ", shape_str(s));
  LT_CHECK(t.dtype() == dt || (t.dtype() == DType::kF32 && dt != DType::kF64), op, ": ", name, " ",
           t.str(), " must be ", dtype_name(dt), " or f32");
}

}  // namespace

void linear_fwd_cuda(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const char* op = "linear_fwd_cuda";
  const Device d = x.device();
  LT_CHECK(d.is_cuda() && x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) &&
               x.dtype() == w.dtype() && dtype_is_floating(x.dtype()),
           op, ": x ", x.str(), ", W ", w.str());
  cu::check_on(w, d, op, "W");
  if (b.defined()) {
    cu::check_on(b, d, op, "b");
    LT_CHECK(b.dim() == 1 && b.size(0) == w.size(0) && b.dtype() == w.dtype(), op, ": b ", b.str(),
             " for W ", w.str());
  }
  const int64_t t = x.size(0), in = x.size(1), out = w.size(0);
  cu::check_operand(y, d, op, "y");
  LT_CHECK(y.shape() == (Shape{t, out}) && y.dtype() == x.dtype(), op, ": y ", y.str(), " for x ",
           x.str(), " and W ", w.str());
  if (t == 0 || out == 0) return;
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const DType dt = x.dtype();
  // The bias epilogue reads 16-byte vectors: an aligned copy of an unaligned view.
  const Tensor bc = b.defined() ? cu::aligned16_ws(b) : Tensor();
  if (in == 0) {
    ops::fill(y, 0.0);
    if (bc.defined()) ops::add_(y, bc);
    return;
  }
  const Rows xr = as_rows(x, dt), wr = as_rows(w, dt);
  const bool epilogue_bias = bc.defined() && dt != DType::kF64;
  gemm_launch(wr, /*ta=*/true, xr, /*tb=*/false, y.data_ptr(), dt, out, t, in,
              epilogue_bias ? bc.data_ptr() : nullptr, dt, d, s);
  if (bc.defined() && !epilogue_bias) ops::add_(y, bc);
}

void linear_bwd_cuda(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                     const Tensor& dw, const Tensor& db) {
  const char* op = "linear_bwd_cuda";
  const Device d = dy.device();
  LT_CHECK(d.is_cuda() && dy.dim() == 2 && dtype_is_floating(dy.dtype()), op, ": dy ", dy.str());
  const int64_t t = dy.size(0), out = dy.size(1);
  // The operands' dtype: x's or W's (dy is converted to it, as the CPU node does).
  const DType dt = x.defined() ? x.dtype() : (w.defined() ? w.dtype() : dy.dtype());
  if (dx.defined()) {
    LT_CHECK(w.defined() && w.dim() == 2 && w.size(0) == out && w.dtype() == dt, op, ": W ",
             w.defined() ? w.str() : "undefined", " for dy ", dy.str());
    cu::check_on(w, d, op, "W");
    check_grad_out(dx, {t, w.size(1)}, dt, d, op, "dx");
  }
  if (dw.defined()) {
    LT_CHECK(x.defined() && x.dim() == 2 && x.size(0) == t && x.dtype() == dt, op, ": x ",
             x.defined() ? x.str() : "undefined", " for dy ", dy.str());
    cu::check_on(x, d, op, "x");
    check_grad_out(dw, {out, x.size(1)}, dt, d, op, "dW");
  }
  if (db.defined()) check_grad_out(db, {out}, dt, d, op, "db");
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const Rows gr = as_rows(dy, dt);
  if (dx.defined()) {
    ProfileScope prof(OpKind::kLinearDx, dy.device());
    const int64_t in = w.size(1);
    if (t > 0 && in > 0) {
      if (out == 0) {
        ops::fill(dx, 0.0);
      } else {
        // dx^T[in,T] = W^T (A = W as stored: column-major [in,out]) * dy^T (B: [out,T]).
        gemm_launch(as_rows(w, dt), false, gr, false, dx.data_ptr(), dx.dtype(), in, t, out,
                    nullptr, dt, d, s);
      }
    }
  }
  // dW and db: the weight-side gradients.
  ProfileScope prof(OpKind::kLinearDw, dy.device());
  if (dw.defined()) {
    const int64_t in = x.size(1);
    if (out > 0 && in > 0) {
      if (t == 0) {
        ops::fill(dw, 0.0);
      } else {
        // dW^T[in,out] = x^T (A: column-major [in,T]) * dy (B stored [out,T], transposed).
        gemm_launch(as_rows(x, dt), false, gr, true, dw.data_ptr(), dw.dtype(), in, out, t, nullptr,
                    dt, d, s);
      }
    }
  }
  if (db.defined() && out > 0) {
    if (t == 0)
      ops::fill(db, 0.0);
    else
      cu::column_sum(gr.ptr, dt, t, out, gr.ld, db.data_ptr(), db.dtype(), d, s);
  }
}

}  // namespace leantune::kernels
