// residual_add: y = a + b
//   a, b, y: same shape and float dtype (y contiguous); the sum is formed in f32 (f64 for f64)
//   and rounded once.
// Backward: da = db = dy, passed through without a copy; nothing is saved.
#include "kernels/residual.h"

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cpu_common.h"

namespace leantune::kernels {

namespace {

class ResidualAddBackward final : public Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& dy = grads[0];
    return {needs_input_grad(0) ? dy : Tensor(), needs_input_grad(1) ? dy : Tensor()};
  }
  std::string name() const override { return "ResidualAddBackward"; }
};

}  // namespace

void residual_add_fwd(const Tensor& a, const Tensor& b, const Tensor& y) {
  LT_CHECK(a.shape() == b.shape() && a.shape() == y.shape() && a.dtype() == b.dtype() &&
               a.dtype() == y.dtype() && dtype_is_floating(a.dtype()),
           "residual_add: a ", a.str(), ", b ", b.str(), ", y ", y.str());
  LT_CHECK(y.is_contiguous(), "residual_add: y ", y.str(), " must be contiguous");
  if (a.device().is_cuda()) {
    residual_add_fwd_cuda(a, b, y);
    return;
  }
  const Tensor ac = ops::contiguous_workspace(a), bc = ops::contiguous_workspace(b);
  const int64_t n = y.numel();
  LT_DISPATCH_FLOAT(y.dtype(), T, {
    const T* pa = static_cast<const T*>(ac.data_ptr());
    const T* pb = static_cast<const T*>(bc.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    parallel_for(n, 1 << 15, [&](int64_t i) { store(py, i, load(pa, i) + load(pb, i)); });
  });
}

Tensor residual_add(const Tensor& a, const Tensor& b) {
  Tensor y = Tensor::empty(a.shape(), a.dtype(), a.device());
  residual_add_fwd(a.detach(), b.detach(), y);
  if (node_needed({a, b})) {
    auto node = std::make_shared<ResidualAddBackward>();
    node->set_next_edges({a, b});
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
