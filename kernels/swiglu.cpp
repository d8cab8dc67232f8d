// The gated MLP activations, swiglu and geglu (contract in the header):
//   gate, up, y: [T,I] (any shape, equal), one float dtype; math in f32 (f64 for f64), one
//   rounding per output element.
// swiglu backward: with s = sigmoid(g): dgate = dy * up * s * (1 + g * (1 - s)), dup = dy * g * s.
// geglu backward: with t = tanh(b (g + k g^3)): dgate = dy * up * gelu'(g), dup = dy * gelu(g).
// Saved for backward: gate and up (y is recomputed where needed, never saved). No scratch beyond
// contiguous copies of strided inputs.
#include "kernels/swiglu.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/cpu_common.h"

namespace leantune::kernels {

namespace {

constexpr int64_t kGrain = 1 << 14;

enum class Act { kSilu, kGeluTanh };

// Overflow-free logistic function: exp of a non-positive argument only.
template <typename A>
A sigmoid(A x) {
  if (x >= A(0)) return A(1) / (A(1) + std::exp(-x));
  const A e = std::exp(x);
  return e / (A(1) + e);
}

// y = act(g) * u, as torch computes act (gelu tanh: kBeta = sqrt(2) * 2/sqrt(pi) / 2).
template <Act kAct, typename A>
A gated_value(A g, A u) {
  if constexpr (kAct == Act::kSilu) {
    return g * sigmoid(g) * u;
  } else {
    const A beta = static_cast<A>(0.7978845608028654), kappa = static_cast<A>(0.044715);
    const A t = std::tanh(beta * (g + kappa * (g * g * g)));
    return A(0.5) * g * (A(1) + t) * u;
  }
}

// The gradients of y = act(g) * u for an output gradient d.
template <Act kAct, typename A>
void gated_grads(A g, A u, A d, A* dg, A* du) {
  if constexpr (kAct == Act::kSilu) {
    const A s = sigmoid(g);
    *dg = d * u * s * (A(1) + g * (A(1) - s));
    *du = d * g * s;
  } else {
    const A beta = static_cast<A>(0.7978845608028654), kappa = static_cast<A>(0.044715);
    const A t = std::tanh(beta * (g + kappa * (g * g * g)));
    const A slope =
        A(0.5) * (A(1) + t) + A(0.5) * g * (A(1) - t * t) * beta * (A(1) + A(3) * kappa * g * g);
    *dg = d * u * slope;
    *du = d * (A(0.5) * g * (A(1) + t));
  }
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

template <Act kAct>
void gated_fwd_cpu(const Tensor& gate, const Tensor& up, const Tensor& y) {
  const Tensor gc = ops::contiguous_workspace(gate), uc = ops::contiguous_workspace(up);
  const int64_t n = y.numel();
  LT_DISPATCH_FLOAT(y.dtype(), T, {
    const T* pg = static_cast<const T*>(gc.data_ptr());
    const T* pu = static_cast<const T*>(uc.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    parallel_for(n, kGrain,
                 [&](int64_t i) { store(py, i, gated_value<kAct>(load(pg, i), load(pu, i))); });
  });
}

template <Act kAct>
void gated_bwd_cpu(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                   const Tensor& dup) {
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
      A dg, du;
      gated_grads<kAct>(load(pg, i), load(pu, i), load(pd, i), &dg, &du);
      if (pdg) store(pdg, i, dg);
      if (pdu) store(pdu, i, du);
    });
  });
}

void gated_fwd(Act act, const Tensor& gate, const Tensor& up, const Tensor& y) {
  ProfileScope prof(OpKind::kActivation, gate.device());
  const char* op = act == Act::kSilu ? "swiglu_fwd" : "geglu_fwd";
  check_pair(op, gate, up);
  check_out(op, gate, y, "y");
  if (gate.device().is_cuda()) {
    act == Act::kSilu ? swiglu_fwd_cuda(gate, up, y) : geglu_fwd_cuda(gate, up, y);
    return;
  }
  act == Act::kSilu ? gated_fwd_cpu<Act::kSilu>(gate, up, y)
                    : gated_fwd_cpu<Act::kGeluTanh>(gate, up, y);
}

void gated_bwd(Act act, const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
               const Tensor& dup) {
  ProfileScope prof(OpKind::kActivation, gate.device());
  const char* op = act == Act::kSilu ? "swiglu_bwd" : "geglu_bwd";
  check_pair(op, gate, up);
  LT_CHECK(dy.shape() == gate.shape() && dy.dtype() == gate.dtype(), op, ": dy ", dy.str(),
           " for gate ", gate.str());
  check_out(op, gate, dgate, "dgate");
  check_out(op, gate, dup, "dup");
  if (gate.device().is_cuda()) {
    act == Act::kSilu ? swiglu_bwd_cuda(dy, gate, up, dgate, dup)
                      : geglu_bwd_cuda(dy, gate, up, dgate, dup);
    return;
  }
  act == Act::kSilu ? gated_bwd_cpu<Act::kSilu>(dy, gate, up, dgate, dup)
                    : gated_bwd_cpu<Act::kGeluTanh>(dy, gate, up, dgate, dup);
}

class GatedBackward final : public Node {
 public:
  SavedTensor gate, up;
  Act act = Act::kSilu;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const Tensor g = gate.unpack(), u = up.unpack();
    Tensor dy = grads[0];
    if (dy.dtype() != g.dtype()) dy = dy.to(g.dtype());
    Tensor dg, du;
    if (needs_input_grad(0)) dg = Tensor::empty(g.shape(), g.dtype(), g.device());
    if (needs_input_grad(1)) du = Tensor::empty(g.shape(), g.dtype(), g.device());
    gated_bwd(act, dy, g, u, dg, du);
    return {dg, du};
  }
  std::string name() const override {
    return act == Act::kSilu ? "SwigluBackward" : "GegluBackward";
  }
  void release_saved() override {
    gate.reset();
    up.reset();
  }
};

Tensor gated(Act act, const Tensor& gate, const Tensor& up) {
  check_pair(act == Act::kSilu ? "swiglu" : "geglu", gate, up);
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  gated_fwd(act, gate.detach(), up.detach(), y);
  if (node_needed({gate, up})) {
    auto node = std::make_shared<GatedBackward>();
    node->act = act;
    node->set_next_edges({gate, up});
    node->gate = SavedTensor(gate);
    node->up = SavedTensor(up);
    set_history(y, node);
  }
  return y;
}

}  // namespace

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& y) {
  gated_fwd(Act::kSilu, gate, up, y);
}
void swiglu_bwd(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                const Tensor& dup) {
  gated_bwd(Act::kSilu, dy, gate, up, dgate, dup);
}
Tensor swiglu(const Tensor& gate, const Tensor& up) { return gated(Act::kSilu, gate, up); }

void geglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& y) {
  gated_fwd(Act::kGeluTanh, gate, up, y);
}
void geglu_bwd(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
               const Tensor& dup) {
  gated_bwd(Act::kGeluTanh, dy, gate, up, dgate, dup);
}
Tensor geglu(const Tensor& gate, const Tensor& up) { return gated(Act::kGeluTanh, gate, up); }

}  // namespace leantune::kernels
