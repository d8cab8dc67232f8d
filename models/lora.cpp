// LoRA adapters on LinearModule (see lora.h).
#include "models/lora.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/dropout.h"

namespace leantune {

namespace {

// x as a contiguous [T, in] matrix without autograd history.
Tensor as_rows(const Tensor& x, int64_t in) {
  Tensor m = x.detach().reshape({-1, in});
  return m.is_contiguous() ? m : m.contiguous();
}

class LoraLinearBackward final : public Node {
 public:
  SavedTensor x, u, a, b;
  double scaling = 1.0;
  double p = 0.0;
  PhiloxParams params{};
  Shape x_shape;
  int64_t in = 0, r = 0, out_f = 0;
  DType dtype = DType::kF32;
  Device device;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& dy = grads[0];
    std::vector<Tensor> out(4);
    if (!dy.defined()) return out;
    if (needs_input_grad(1)) out[1] = dy;
    const bool need_x = needs_input_grad(0), need_a = needs_input_grad(2),
               need_b = needs_input_grad(3);
    const Tensor dy2 = as_rows(dy, out_f);
    const int64_t t = dy2.size(0);
    if (need_b) {
      ProfileScope prof(OpKind::kLinearDw, device);
      Tensor db = Tensor::empty({out_f, r}, dtype, device);
      ops::gemm(dy2, true, u.unpack(), false, db, scaling);
      out[3] = db;
    }
    if (!need_x && !need_a) return out;
    Tensor du = Tensor::empty({t, r}, dtype, device);
    {
      ProfileScope prof(OpKind::kLinearDx, device);
      ops::gemm(dy2, false, b.unpack(), false, du, scaling);
    }
    if (need_a) {
      Tensor xd = as_rows(x.unpack(), in);
      if (p > 0.0) {
        Tensor dropped = Tensor::empty(xd.shape(), xd.dtype(), xd.device(), MemTag::kWorkspace);
        kernels::dropout_fwd(xd, dropped, p, params);
        xd = dropped;
      }
      ProfileScope prof(OpKind::kLinearDw, device);
      Tensor da = Tensor::empty({r, in}, dtype, device);
      ops::gemm(du, true, xd, false, da);
      out[2] = da;
    }
    if (need_x) {
      ProfileScope prof(OpKind::kLinearDx, device);
      Tensor dx = Tensor::empty({t, in}, dtype, device);
      ops::gemm(du, false, a.unpack(), false, dx);
      if (p > 0.0) kernels::dropout_bwd(dx, dx, p, params);
      out[0] = dx.view(x_shape);
    }
    return out;
  }
  std::string name() const override { return "LoraLinearBackward"; }
  void release_saved() override {
    x.reset();
    u.reset();
    a.reset();
    b.reset();
  }
};

// One ReplayableState for every dropout generator of the process, registered with the engine
// once and never destroyed; it follows the generators through weak references.
class DropoutReplay final : public ReplayableState {
 public:
  void add(const std::shared_ptr<Generator>& g) {
    std::lock_guard<std::mutex> lk(mu_);
    std::erase_if(gens_, [](const std::weak_ptr<Generator>& w) { return w.expired(); });
    for (const auto& w : gens_)
      if (w.lock() == g) return;
    gens_.push_back(g);
  }
  std::shared_ptr<void> capture() override {
    std::lock_guard<std::mutex> lk(mu_);
    auto state = std::make_shared<std::vector<std::pair<std::weak_ptr<Generator>, uint64_t>>>();
    for (const auto& w : gens_)
      if (auto g = w.lock()) state->emplace_back(w, g->offset());
    return state;
  }
  void restore(const std::shared_ptr<void>& s) override {
    const auto& state =
        *static_cast<std::vector<std::pair<std::weak_ptr<Generator>, uint64_t>>*>(s.get());
    for (const auto& [w, offset] : state)
      if (auto g = w.lock()) g->set_offset(offset);
  }

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<Generator>> gens_;
};

DropoutReplay& dropout_replay() {
  // Leaked on purpose: the engine's registry keeps a raw pointer for the life of the process.
  static DropoutReplay* r = [] {
    auto* p = new DropoutReplay;
    register_replayable_state(p);
    return p;
  }();
  return *r;
}

}  // namespace

double lora_scaling(double alpha, int64_t r, bool use_rslora) {
  LT_CHECK_INPUT(r > 0, "lora_r must be positive, got ", r);
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

void register_dropout_generator(const std::shared_ptr<Generator>& gen) {
  LT_CHECK(gen != nullptr, "register_dropout_generator: null generator");
  dropout_replay().add(gen);
}

Tensor lora_linear(const Tensor& x, Tensor base_out, const Tensor& A, const Tensor& B,
                   double scaling, double dropout_p, Generator* gen) {
  ProfileScope prof(OpKind::kLinearFwd, x.device());
  LT_CHECK(A.defined() && B.defined() && A.dim() == 2 && B.dim() == 2 && B.size(1) == A.size(0),
           "lora_linear: A ", A.str(), ", B ", B.str());
  const int64_t in = A.size(1), r = A.size(0), out_f = B.size(0);
  LT_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) == in, "lora_linear: x ", x.str(), " for A ",
           A.str());
  LT_CHECK(
      base_out.dim() == x.dim() && base_out.size(base_out.dim() - 1) == out_f &&
          base_out.numel() / std::max<int64_t>(out_f, 1) == x.numel() / std::max<int64_t>(in, 1),
      "lora_linear: base_out ", base_out.str(), " for x ", x.str(), " and B ", B.str());
  LT_CHECK(x.dtype() == A.dtype() && B.dtype() == A.dtype() && base_out.dtype() == A.dtype() &&
               dtype_is_floating(A.dtype()),
           "lora_linear: dtypes of x ", x.str(), ", base_out ", base_out.str(), ", A ", A.str(),
           ", B ", B.str(), " differ");
  LT_CHECK(x.device() == A.device() && B.device() == A.device() && base_out.device() == A.device(),
           "lora_linear: operands on different devices");
  LT_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, "lora_linear: dropout ", dropout_p);
  LT_CHECK(dropout_p == 0.0 || gen != nullptr, "lora_linear: dropout without a generator");

  const Tensor x2 = as_rows(x, in);
  const int64_t t = x2.size(0);
  PhiloxParams params{};
  Tensor xd = x2;
  if (dropout_p > 0.0) {
    params = gen->take(x2.numel());
    xd = Tensor::empty(x2.shape(), x2.dtype(), x2.device(), MemTag::kWorkspace);
    kernels::dropout_fwd(x2, xd, dropout_p, params);
  }
  Tensor u = Tensor::empty({t, r}, A.dtype(), A.device());
  ops::gemm(xd, false, A.detach(), true, u);
  xd = Tensor();
  Tensor y;
  if (sole_contiguous(base_out)) {
    y = base_out.detach();
  } else {
    y = Tensor::empty(base_out.shape(), base_out.dtype(), base_out.device());
    ops::copy(y, base_out.detach());
  }
  ops::gemm(u, false, B.detach(), true, y.view({t, out_f}), scaling, 1.0);

  if (node_needed({x, base_out, A, B})) {
    auto node = std::make_shared<LoraLinearBackward>();
    node->set_next_edges({x, base_out, A, B});
    node->scaling = scaling;
    node->p = dropout_p;
    node->params = params;
    node->x_shape = x.shape();
    node->in = in;
    node->r = r;
    node->out_f = out_f;
    node->dtype = A.dtype();
    node->device = A.device();
    if (node->needs_input_grad(2)) node->x = SavedTensor(x);
    if (node->needs_input_grad(3)) node->u = SavedTensor(u);
    if (node->needs_input_grad(0)) node->a = SavedTensor(A);
    if (node->needs_input_grad(0) || node->needs_input_grad(2)) node->b = SavedTensor(B);
    set_history(y, node);
  }
  return y;
}

LoraAdapter::LoraAdapter(std::string module_name, int64_t in_features, int64_t out_features,
                         int64_t r, double alpha, bool use_rslora, double dropout, Device device,
                         DType dtype, std::shared_ptr<LoraRuntime> runtime)
    : module_name_(std::move(module_name)),
      r_(r),
      alpha_(alpha),
      scaling_(lora_scaling(alpha, r, use_rslora)),
      dropout_(dropout),
      runtime_(std::move(runtime)) {
  LT_CHECK_INPUT(dropout >= 0.0 && dropout < 1.0, "lora_dropout must be in [0, 1), got ", dropout);
  LT_CHECK(runtime_ != nullptr, "LoraAdapter without a runtime");
  a_ = Tensor::zeros({r, in_features}, dtype, device, MemTag::kParam);
  b_ = Tensor::zeros({out_features, r}, dtype, device, MemTag::kParam);
  a_.set_name(module_name_ + ".lora_A.weight").set_param(true).set_requires_grad(true);
  b_.set_name(module_name_ + ".lora_B.weight").set_param(true).set_requires_grad(true);
}

Tensor LoraAdapter::forward(const Tensor& x, Tensor base_out) const {
  if (!runtime_->enabled) return base_out;
  const double p = runtime_->training ? dropout_ : 0.0;
  if (p > 0.0)
    LT_CHECK(runtime_->dropout_gen != nullptr, "LoRA dropout ", p, " on ", module_name_,
             " without a dropout generator");
  return lora_linear(x, std::move(base_out), a_, b_, scaling_, p,
                     p > 0.0 ? runtime_->dropout_gen.get() : nullptr);
}

void LoraAdapter::reset_parameters(Generator& gen) {
  NoGradGuard ng;
  const double bound = 1.0 / std::sqrt(static_cast<double>(a_.size(1)));
  uniform_(a_, gen, -bound, bound);
  b_.zero_();
}

Tensor LoraAdapter::delta_weight(DType dtype) const {
  NoGradGuard ng;
  const DType acc = a_.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const Tensor a = a_.dtype() == acc ? a_.detach() : a_.detach().to(acc);
  const Tensor b = b_.dtype() == acc ? b_.detach() : b_.detach().to(acc);
  Tensor d = Tensor::empty({b.size(0), a.size(1)}, acc, a.device(), MemTag::kWorkspace);
  ops::gemm(b, false, a, false, d, scaling_);
  return d.dtype() == dtype ? d : d.to(dtype);
}

}  // namespace leantune
