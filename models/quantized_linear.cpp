// Nf4Linear / Int8Linear: the LinearBase subclasses and their autograd node. The products
// themselves (dequantize into the scratch, dense GEMM) are kernels/quant's; this file flattens
// leading dimensions, allocates outputs and records the backward node.
// Saved for backward: the quantized weight (a shallow copy: the same storage as the module's)
// and x's shape and dtype; nothing goes through the saved-tensor hooks because nothing
// activation-sized is kept.
#include "models/quantized_linear.h"

#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace leantune {

namespace {

// Per-format entry points, so that one forward and one node serve both formats.
template <typename W, auto kFwd, auto kBwd>
struct QuantOps {
  using Weight = W;
  static void fwd(const Tensor& x, const Weight& w, const Tensor& b, const Tensor& y) {
    kFwd(x, w, b, y);
  }
  static void bwd(const Tensor& dy, const Weight& w, const Tensor& dx, const Tensor& db) {
    kBwd(dy, w, dx, db);
  }
};
struct Nf4Ops : QuantOps<kernels::Nf4Weight, kernels::nf4_linear_fwd, kernels::nf4_linear_bwd> {
  static constexpr const char* kNode = "Nf4LinearBackward";
};
struct Int8Ops : QuantOps<kernels::Int8Weight, kernels::int8_linear_fwd, kernels::int8_linear_bwd> {
  static constexpr const char* kNode = "Int8LinearBackward";
};

template <typename Ops>
class QuantLinearBackward final : public Node {
 public:
  typename Ops::Weight w;
  Shape x_shape;
  int64_t in = 0, out = 0;
  DType dtype = DType::kF32;
  bool has_bias = false;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> res(2);
    if (!grads[0].defined()) return res;
    const Tensor& g = grads[0];
    Tensor dy = g.reshape({-1, out});
    if (dy.dtype() != dtype || !dy.is_contiguous()) {
      Tensor c = Tensor::empty(dy.shape(), dtype, dy.device(), MemTag::kWorkspace);
      ops::copy(c, dy);
      dy = c;
    }
    Tensor dx, db;
    if (needs_input_grad(0)) dx = Tensor::empty({dy.size(0), in}, dtype, dy.device());
    if (has_bias && needs_input_grad(1)) db = Tensor::empty({out}, dtype, dy.device());
    Ops::bwd(dy, w, dx, db);
    if (dx.defined()) res[0] = dx.view(x_shape);
    res[1] = db;
    return res;
  }
  std::string name() const override { return Ops::kNode; }
};

template <typename Ops>
Tensor quant_forward(const typename Ops::Weight& w, int64_t out, int64_t in, const Tensor& x,
                     const Tensor& bias) {
  LT_CHECK(x.defined() && x.dim() >= 1 && x.size(x.dim() - 1) == in, Ops::kNode, ": input ",
           x.defined() ? x.str() : "undefined", " for a linear with ", in, " input features");
  const Tensor x2 = x.detach().reshape({-1, in});
  Tensor y = Tensor::empty({x2.size(0), out}, x.dtype(), x.device());
  Ops::fwd(x2, w, bias.defined() ? bias.detach() : Tensor(), y);
  Shape ys = x.shape();
  ys.back() = out;
  y = y.view(ys);
  if (node_needed({x, bias})) {
    auto node = std::make_shared<QuantLinearBackward<Ops>>();
    node->set_next_edges({x, bias});
    node->w = w;
    node->x_shape = x.shape();
    node->in = in;
    node->out = out;
    node->dtype = x.dtype();
    node->has_bias = bias.defined();
    set_history(y, node);
  }
  return y;
}

// Quantizes a dense [out, in] weight: quantize(host weight, tag) runs on the host, then the result
// moves to `device` as a kParam (the host form is the parameter itself when `device` is the host).
template <typename Linear, typename Quantize>
std::shared_ptr<Linear> quantize_dense(const Tensor& w, Device device, const char* what,
                                       Quantize quantize) {
  LT_CHECK(w.defined() && w.dim() == 2, what, ": weight ", w.defined() ? w.str() : "undefined",
           " is not [out, in]");
  auto q = quantize(w.device().is_cpu() ? w : w.detach().to(Device::cpu()),
                    device.is_cpu() ? MemTag::kParam : MemTag::kOther);
  return std::make_shared<Linear>(device.is_cpu() ? q : q.to(device, MemTag::kParam));
}

}  // namespace

Nf4Linear::Nf4Linear(kernels::Nf4Weight w) : QuantizedLinear(std::move(w)) {
  const Shape& shape = weight().shape;
  LT_CHECK(shape.size() == 2, "Nf4Linear: weight shape ", shape_str(shape), " is not [out, in]");
  kernels::check_nf4(weight(), "Nf4Linear");
}

std::shared_ptr<Nf4Linear> Nf4Linear::quantize(const Tensor& w, Device device, bool double_quant) {
  return quantize_dense<Nf4Linear>(w, device, "Nf4Linear::quantize",
                                   [&](const Tensor& host, MemTag tag) {
                                     return kernels::nf4_quantize(host, double_quant, tag);
                                   });
}

Tensor Nf4Linear::forward(const Tensor& x, const Tensor& bias) const {
  return quant_forward<Nf4Ops>(weight(), out_features(), in_features(), x, bias);
}

Tensor Nf4Linear::dequantize(DType dtype) const { return kernels::nf4_dequantize(weight(), dtype); }

std::vector<std::pair<std::string, Tensor>> Nf4Linear::stored_tensors() const {
  const kernels::Nf4Weight& w = weight();
  if (!w.nested()) return {{"weight", w.packed}, {"weight.absmax", w.absmax}};
  return {{"weight", w.packed}, {"weight.absmax", w.qabsmax}, {"weight.nested_absmax", w.absmax2}};
}

Int8Linear::Int8Linear(kernels::Int8Weight w) : QuantizedLinear(std::move(w)) {
  kernels::check_int8(weight(), "Int8Linear");
}

std::shared_ptr<Int8Linear> Int8Linear::quantize(const Tensor& w, Device device) {
  return quantize_dense<Int8Linear>(w, device, "Int8Linear::quantize", kernels::int8_quantize);
}

Tensor Int8Linear::forward(const Tensor& x, const Tensor& bias) const {
  return quant_forward<Int8Ops>(weight(), out_features(), in_features(), x, bias);
}

Tensor Int8Linear::dequantize(DType dtype) const {
  return kernels::int8_dequantize(weight(), dtype);
}

std::vector<std::pair<std::string, Tensor>> Int8Linear::stored_tensors() const {
  return {{"weight", weight().q}, {"SCB", weight().absmax}};
}

}  // namespace leantune
