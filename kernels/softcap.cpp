// softcap: see the header.
#include "kernels/softcap.h"

#include "engine/autograd.h"
#include "engine/ops.h"

namespace leantune::kernels {

namespace {

class SoftcapBackward final : public Node {
 public:
  SavedTensor t;
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined() || !needs_input_grad(0)) return {Tensor()};
    const Tensor ts = t.unpack();
    // 1 - t^2, then times dy.
    const Tensor slope = ops::affine(ops::mul(ts, ts), -1.0, 1.0);
    Tensor dy = grads[0];
    if (dy.dtype() != ts.dtype()) dy = dy.to(ts.dtype());
    return {ops::mul(dy, slope)};
  }
  std::string name() const override { return "SoftcapBackward"; }
  void release_saved() override { t.reset(); }
};

}  // namespace

Tensor softcap(const Tensor& x, double cap) {
  LT_CHECK(dtype_is_floating(x.dtype()) && cap > 0, "softcap: x ", x.str(), ", cap ", cap);
  const Tensor c = Tensor::full({}, cap, x.dtype(), x.device());
  const Tensor t = ops::unary(ops::div(x.detach(), c), ops::Unary::kTanh);
  Tensor y = ops::scale(t, cap);
  if (node_needed({x})) {
    auto node = std::make_shared<SoftcapBackward>();
    node->t = SavedTensor(t);
    node->set_next_edges({x});
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
