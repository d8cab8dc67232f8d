// scale: see the header.
#include "kernels/scale.h"

#include "engine/autograd.h"
#include "engine/ops.h"

namespace leantune::kernels {

namespace {

class ScaleBackward final : public Node {
 public:
  double s = 1.0;
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined() || !needs_input_grad(0)) return {Tensor()};
    return {ops::scale(grads[0], s)};
  }
  std::string name() const override { return "ScaleBackward"; }
};

}  // namespace

double round_to_dtype(double v, DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(static_cast<float>(v)));
    case DType::kF16:
      return f16_to_f32(f32_to_f16(static_cast<float>(v)));
    case DType::kF32:
      return static_cast<float>(v);
    default:
      return v;
  }
}

Tensor scale(const Tensor& x, double s) {
  LT_CHECK(dtype_is_floating(x.dtype()), "scale: x ", x.str(), " must be a float tensor");
  Tensor y = ops::scale(x.detach(), s);
  if (node_needed({x})) {
    auto node = std::make_shared<ScaleBackward>();
    node->s = s;
    node->set_next_edges({x});
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
