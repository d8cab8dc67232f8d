// swiglu: y = silu(gate) * up, silu(g) = g * sigmoid(g)
//   gate, up, y: [T,I] (any shape, equal), one float dtype; math in f32 (f64 for f64), one
//   rounding per output element.
// Backward: with s = sigmoid(g): dgate = dy * up * s * (1 + g * (1 - s)), dup = dy * g * s.
// Saved for backward: gate and up (y is recomputed where needed, never saved). No scratch beyond
// contiguous copies of strided inputs.
#include "kernels/swiglu.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/cpu_kernels.h"
#include "engine/ops.h"

namespace leantune::kernels {

using cpu::acc_t;
using cpu::load;
using cpu::parallel_for;
using cpu::store;

namespace {

constexpr int64_t kGrain = 1 << 14;

// Overflow-free logistic function: exp of a non-positive argument only.
template <typename A>
A sigmoid(A x) {
  if (x >= A(0)) return A(1) / (A(1) + std::exp(-x));
  const A e = std::exp(x);
  return e / (A(1) + e);
}

void check_pair(const char* op, const Tensor& gate, const Tensor& up) {
  LT_CHECK(
      gate.shape() == up.shape() && gate.dtype() == up.dtype() && dtype_is_floating(gate.dtype()),
      op, ": gate ", gate.str(), ", up ", up.str());
}

void check_out(const char* op, const Tensor& ref, const Tensor& t, const char* what) {
  if (!t.defined()) return;
  LT_CHECK(t.shape() == ref.shape() && t.dtype() == ref.dtype() && t.is_contiguous(), op, ": ",
           what, " ", t.str(), " for gate ", ref.str());
}

class SwigluBackward final : public Node {
 public:
  SavedTensor gate, up;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const Tensor g = gate.unpack(), u = up.unpack();
    Tensor dy = grads[0];
    if (dy.dtype() != g.dtype()) dy = dy.to(g.dtype());
    Tensor dg, du;
    if (needs_input_grad(0)) dg = Tensor::empty(g.shape(), g.dtype(), g.device());
    if (needs_input_grad(1)) du = Tensor::empty(g.shape(), g.dtype(), g.device());
    swiglu_bwd(dy, g, u, dg, du);
    return {dg, du};
  }
  std::string name() const override { return "SwigluBackward"; }
  void release_saved() override {
    gate.reset();
    up.reset();
  }
};

}  // namespace

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& y) {
  check_pair("swiglu_fwd", gate, up);
  check_out("swiglu_fwd", gate, y, "y");
  if (gate.device().is_cuda()) {
    swiglu_fwd_cuda(gate, up, y);
    return;
  }
  const Tensor gc = ops::contiguous_workspace(gate), uc = ops::contiguous_workspace(up);
  const int64_t n = y.numel();
  LT_DISPATCH_FLOAT(y.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = static_cast<const T*>(gc.data_ptr());
    const T* pu = static_cast<const T*>(uc.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    parallel_for(n, kGrain, [&](int64_t i) {
      const A g = load(pg, i);
      store(py, i, g * sigmoid(g) * load(pu, i));
    });
  });
}

void swiglu_bwd(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                const Tensor& dup) {
  check_pair("swiglu_bwd", gate, up);
  LT_CHECK(dy.shape() == gate.shape() && dy.dtype() == gate.dtype(), "swiglu_bwd: dy ", dy.str(),
           " for gate ", gate.str());
  check_out("swiglu_bwd", gate, dgate, "dgate");
  check_out("swiglu_bwd", gate, dup, "dup");
  if (gate.device().is_cuda()) {
    swiglu_bwd_cuda(dy, gate, up, dgate, dup);
    return;
  }
  const Tensor gc = ops::contiguous_workspace(gate), uc = ops::contiguous_workspace(up),
               dc = ops::contiguous_workspace(dy);
  const int64_t n = gate.numel();
  LT_DISPATCH_FLOAT(gate.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = static_cast<const T*>(gc.data_ptr());
    const T* pu = static_cast<const T*>(uc.data_ptr());
    const T* pd = static_cast<const T*>(dc.data_ptr());
    T* pdg = dgate.defined() ? static_cast<T*>(dgate.data_ptr()) : nullptr;
    T* pdu = dup.defined() ? static_cast<T*>(dup.data_ptr()) : nullptr;
    parallel_for(n, kGrain, [&](int64_t i) {
      const A g = load(pg, i), d = load(pd, i);
      const A s = sigmoid(g);
      if (pdg) store(pdg, i, d * load(pu, i) * s * (A(1) + g * (A(1) - s)));
      if (pdu) store(pdu, i, d * g * s);
    });
  });
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  check_pair("swiglu", gate, up);
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  swiglu_fwd(gate.detach(), up.detach(), y);
  if (node_needed({gate, up})) {
    auto node = std::make_shared<SwigluBackward>();
    node->set_next_edges({gate, up});
    node->gate = SavedTensor(gate);
    node->up = SavedTensor(up);
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
