// split_columns: see the header. Saved for backward: nothing but the shapes.
#include "kernels/split.h"

#include "engine/autograd.h"
#include "engine/ops.h"

namespace leantune::kernels {

namespace {

class SplitColumnsBackward final : public Node {
 public:
  Shape in_shape;
  DType dtype = DType::kF32;
  Device device = Device::cpu();
  std::vector<int64_t> starts, widths;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!needs_input_grad(0)) return {Tensor()};
    Tensor dx = Tensor::empty(in_shape, dtype, device);
    const int64_t t = in_shape[0];
    for (size_t i = 0; i < widths.size(); ++i) {
      const Tensor dst = dx.narrow(1, starts[i], widths[i]);
      if (!grads[i].defined()) {
        ops::fill(dst, 0.0);
        continue;
      }
      const Tensor g = grads[i].is_contiguous() ? grads[i] : grads[i].contiguous();
      ops::copy(dst, g.view({t, widths[i]}));
    }
    return {dx};
  }
  std::string name() const override { return "SplitColumnsBackward"; }
};

}  // namespace

std::vector<Tensor> split_columns(const Tensor& x, const std::vector<Shape>& parts) {
  LT_CHECK(x.dim() == 2 && x.is_contiguous() && !parts.empty(), "split_columns: x ", x.str(),
           " must be a contiguous [T, C] tensor");
  const int64_t t = x.size(0), c = x.size(1);
  std::vector<Tensor> out;
  std::vector<int64_t> starts, widths;
  int64_t col = 0;
  for (const Shape& p : parts) {
    const int64_t w = shape_numel(p);
    Shape shape{t}, strides{c};
    shape.insert(shape.end(), p.begin(), p.end());
    const Shape inner = contiguous_strides(p);
    strides.insert(strides.end(), inner.begin(), inner.end());
    out.push_back(make_view(x.detach(), shape, strides, x.offset() + col));
    starts.push_back(col);
    widths.push_back(w);
    col += w;
  }
  LT_CHECK(col == c, "split_columns: parts of ", col, " columns for x ", x.str());
  if (node_needed({x})) {
    auto node = std::make_shared<SplitColumnsBackward>();
    node->in_shape = x.shape();
    node->dtype = x.dtype();
    node->device = x.device();
    node->starts = starts;
    node->widths = widths;
    node->set_num_outputs(static_cast<uint32_t>(out.size()));
    node->set_next_edges({x});
    set_history(out, node);
  }
  return out;
}

}  // namespace leantune::kernels
