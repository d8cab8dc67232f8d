// linear: y = x W^T + b
//   x:[T,in], W:[out,in], b:[out] or undefined -> y:[T,out] (contiguous); one float dtype.
// CPU path: OpenBLAS through ops::gemm, f32 accumulation for f32/bf16/f16 (f64 for f64).
//   forward:  y rows are prefilled with b, then y = x W^T + 1*y, so a 16-bit y is rounded once.
//   backward: dx = dy W, dW = dy^T x (both one gemm, overwritten), db = column sums of dy,
//             summed in fixed 64-column strips so that the result does not depend on threads.
// Saved for backward: x (only when W needs a gradient) and W (only when x needs one); a frozen W
// therefore costs neither a saved x nor any dW work. Scratch: ops::gemm's f32 copies of 16-bit
// operands (kWorkspace) and contiguous copies of strided inputs.
#include "kernels/linear.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/cpu_common.h"

namespace leantune::kernels {

namespace {

// t converted to `dt` and made contiguous (no copy when it already is both).
Tensor as(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return ops::contiguous_workspace(t);
  Tensor c = Tensor::empty(t.shape(), dt, t.device(), MemTag::kWorkspace);
  ops::copy(c, t);
  return c;
}

void check_shapes(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  LT_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), op, ": x ", x.str(), ", W ",
           w.str());
  LT_CHECK(x.dtype() == w.dtype() && dtype_is_floating(x.dtype()), op, ": x ", x.str(), ", W ",
           w.str(), " need one float dtype");
  if (b.defined())
    LT_CHECK(b.dim() == 1 && b.size(0) == w.size(0) && b.dtype() == w.dtype(), op, ": b ", b.str(),
             " for W ", w.str());
}

// db[j] = sum_t dy[t, j]; rows are walked in order inside each column strip.
void bias_grad(const Tensor& dy, const Tensor& db) {
  const int64_t rows = dy.size(0), cols = dy.size(1);
  constexpr int64_t kStrip = 64;
  const int64_t strips = (cols + kStrip - 1) / kStrip;
  LT_DISPATCH_FLOAT(dy.dtype(), T, {
    using A = acc_t<T>;
    const T* g = static_cast<const T*>(dy.data_ptr());
    parallel_for(strips, cpu::grain_for(rows * kStrip), [&](int64_t s) {
      const int64_t c0 = s * kStrip, n = std::min(kStrip, cols - c0);
      A acc[kStrip] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = g + r * cols + c0;
        for (int64_t j = 0; j < n; ++j) acc[j] += load(row, j);
      }
      T* out = static_cast<T*>(db.data_ptr());
      for (int64_t j = 0; j < n; ++j) store(out, c0 + j, acc[j]);
    });
  });
}

class LinearBackward final : public Node {
 public:
  SavedTensor x, w;
  bool has_bias = false;
  Shape x_shape, w_shape;
  DType dtype = DType::kF32;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> out(3);
    if (!grads[0].defined()) return out;
    const Tensor dy = as(grads[0], dtype);
    const Device dev = dy.device();
    Tensor dx, dw, db;
    if (needs_input_grad(0)) dx = Tensor::empty(x_shape, dtype, dev);
    if (needs_input_grad(1)) dw = Tensor::empty(w_shape, dtype, dev);
    if (has_bias && needs_input_grad(2)) db = Tensor::empty({w_shape[0]}, dtype, dev);
    const Tensor xs = x.unpack(), ws = w.unpack();
    linear_bwd(dy, xs, ws, dx, dw, db);
    out[0] = dx;
    out[1] = dw;
    out[2] = db;
    return out;
  }
  std::string name() const override { return "LinearBackward"; }
  void release_saved() override {
    x.reset();
    w.reset();
  }
};

}  // namespace

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  ProfileScope prof(OpKind::kLinearFwd, x.device());
  check_shapes("linear_fwd", x, w, b);
  LT_CHECK(
      y.shape() == (Shape{x.size(0), w.size(0)}) && y.dtype() == x.dtype() && y.is_contiguous(),
      "linear_fwd: y ", y.str(), " for x ", x.str(), " and W ", w.str());
  if (x.device().is_cuda()) {
    linear_fwd_cuda(x, w, b, y);
    return;
  }
  double beta = 0.0;
  if (b.defined() && y.numel() > 0) {
    const Tensor bc = ops::contiguous_workspace(b);
    const int64_t rows = y.size(0), cols = y.size(1);
    const size_t row_bytes = static_cast<size_t>(cols) * y.element_size();
    char* dst = static_cast<char*>(y.data_ptr());
    parallel_for(rows, cpu::grain_for(cols),
                 [&](int64_t r) { std::memcpy(dst + r * row_bytes, bc.data_ptr(), row_bytes); });
    beta = 1.0;
  }
  ops::gemm(ops::contiguous_workspace(x), false, ops::contiguous_workspace(w), true, y, 1.0, beta);
}

void linear_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                const Tensor& dw, const Tensor& db) {
  const int64_t out_f = dw.defined() ? dw.size(0) : (w.defined() ? w.size(0) : dy.size(1));
  LT_CHECK(dy.dim() == 2 && dy.size(1) == out_f, "linear_bwd: dy ", dy.str());
  if (dx.defined()) {
    LT_CHECK(w.defined() && w.dim() == 2 && w.size(0) == dy.size(1), "linear_bwd: W ",
             w.defined() ? w.str() : "undefined", " for dy ", dy.str());
    LT_CHECK(dx.shape() == (Shape{dy.size(0), w.size(1)}) && dx.is_contiguous(), "linear_bwd: dx ",
             dx.str(), " for dy ", dy.str(), " and W ", w.str());
  }
  if (dw.defined()) {
    LT_CHECK(x.defined() && x.dim() == 2 && x.size(0) == dy.size(0), "linear_bwd: x ",
             x.defined() ? x.str() : "undefined", " for dy ", dy.str());
    LT_CHECK(dw.shape() == (Shape{dy.size(1), x.size(1)}) && dw.is_contiguous(), "linear_bwd: dW ",
             dw.str(), " for dy ", dy.str(), " and x ", x.str());
  }
  if (db.defined())
    LT_CHECK(db.shape() == (Shape{dy.size(1)}) && db.is_contiguous(), "linear_bwd: db ", db.str(),
             " for dy ", dy.str());
  if (dy.device().is_cuda()) {
    linear_bwd_cuda(dy, x, w, dx, dw, db);
    return;
  }
  const Tensor g = ops::contiguous_workspace(dy);
  if (dx.defined()) {
    ProfileScope prof(OpKind::kLinearDx, dy.device());
    ops::gemm(g, false, ops::contiguous_workspace(w), false, dx, 1.0, 0.0);
  }
  ProfileScope prof(OpKind::kLinearDw, dy.device());
  if (dw.defined()) ops::gemm(g, true, ops::contiguous_workspace(x), false, dw, 1.0, 0.0);
  if (db.defined()) bias_grad(g.dtype() == db.dtype() ? g : as(g, db.dtype()), db);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_shapes("linear", x, w, b);
  Tensor y = Tensor::empty({x.size(0), w.size(0)}, x.dtype(), x.device());
  linear_fwd(x.detach(), w.detach(), b.defined() ? b.detach() : b, y);
  if (node_needed({x, w, b})) {
    auto node = std::make_shared<LinearBackward>();
    node->set_next_edges({x, w, b});
    if (node->needs_input_grad(1)) node->x = SavedTensor(x);
    if (node->needs_input_grad(0)) node->w = SavedTensor(w);
    node->has_bias = b.defined();
    node->x_shape = x.shape();
    node->w_shape = w.shape();
    node->dtype = x.dtype();
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
