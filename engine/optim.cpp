// The Optimizer interface, AdamW and SGD on the host, and the optimizer in backward (see optim.h).
#include "engine/optim.h"

#include <cmath>
#include <unordered_map>

#include "engine/cpu_kernels.h"
#include "engine/ops.h"

namespace leantune {

namespace {
// One tensor's update in f32 (f64 for f64 parameters, keeping gradchecks exact).
template <typename P, typename G>
void adamw_one(const AdamWTensor& t, const AdamWStepArgs& a) {
  using A = cpu::acc_t<P>;
  const int64_t n = t.param.numel();
  P* p = static_cast<P*>(t.param.data_ptr());
  const G* g = static_cast<const G*>(t.grad.data_ptr());
  float* master = t.master.defined() ? t.master.data<float>() : nullptr;
  A* m = static_cast<A*>(t.exp_avg.data_ptr());
  A* v = static_cast<A*>(t.exp_avg_sq.data_ptr());
  const A b1 = static_cast<A>(a.beta1), b2 = static_cast<A>(a.beta2);
  const A bc1 = static_cast<A>(1.0 - std::pow(a.beta1, static_cast<double>(a.step)));
  const A bc2_sqrt =
      static_cast<A>(std::sqrt(1.0 - std::pow(a.beta2, static_cast<double>(a.step))));
  const A lr = static_cast<A>(a.lr), eps = static_cast<A>(a.eps);
  const A decay = static_cast<A>(1.0 - a.lr * t.weight_decay);
  const A gs = static_cast<A>(a.grad_scale);
  const A step_size = lr / bc1;
  cpu::parallel_for(n, 1 << 14, [&](int64_t i) {
    const A gi = static_cast<A>(cpu::load(g, i)) * gs;
    const A mi = b1 * m[i] + (A(1) - b1) * gi;
    const A vi = b2 * v[i] + (A(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    A w = master ? static_cast<A>(master[i]) : static_cast<A>(cpu::load(p, i));
    w *= decay;
    w -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    if (master) master[i] = static_cast<float>(w);
    cpu::store(p, i, w);
  });
}
}  // namespace

void adamw_step_cpu(const std::vector<AdamWTensor>& tensors, const AdamWStepArgs& args) {
  for (const AdamWTensor& t : tensors) {
    LT_CHECK(t.param.is_contiguous() && t.grad.is_contiguous() && t.grad.numel() == t.param.numel(),
             "adamw: param ", t.param.str(), " grad ", t.grad.str());
    LT_DISPATCH_FLOAT(t.param.dtype(), P,
                      { LT_DISPATCH_FLOAT(t.grad.dtype(), G, { adamw_one<P, G>(t, args); }); });
  }
}

void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWStepArgs& args) {
  if (tensors.empty()) return;
  if (tensors[0].param.device().is_cuda()) {
    adamw_step_cuda(tensors, args);
    return;
  }
  adamw_step_cpu(tensors, args);
}

AdamW::AdamW(std::vector<Param> params, AdamWConfig cfg)
    : params_(std::move(params)), cfg_(cfg), state_(params_.size()) {
  for (const Param& p : params_)
    LT_CHECK(dtype_is_floating(p.tensor.dtype()), "AdamW parameter ", p.name, " is ",
             dtype_name(p.tensor.dtype()));
}

void AdamW::ensure_state(size_t i) {
  AdamWTensor& s = state_[i];
  if (s.exp_avg.defined()) return;
  const Tensor& p = params_[i].tensor;
  const DType sdt = p.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  s.param = p;
  s.exp_avg = Tensor::zeros(p.shape(), sdt, p.device(), MemTag::kOptimizer);
  s.exp_avg_sq = Tensor::zeros(p.shape(), sdt, p.device(), MemTag::kOptimizer);
  if (p.dtype() != DType::kF32 && p.dtype() != DType::kF64) {
    s.master = Tensor::empty(p.shape(), DType::kF32, p.device(), MemTag::kOptimizer);
    ops::copy(s.master, p);
  }
  s.weight_decay = params_[i].decay ? cfg_.weight_decay : 0.0;
}

void Optimizer::step(double lr, double grad_scale) {
  ProfileScope prof(OpKind::kOptimizer,
                    num_params() > 0 ? param(0).tensor.device() : Device::cpu());
  ++step_;
  std::vector<size_t> all;
  for (size_t i = 0; i < num_params(); ++i)
    if (param(i).tensor.grad().defined()) all.push_back(i);
  update(all, lr, grad_scale);
}

void Optimizer::update_rows(size_t i, int64_t, const Tensor&, double) {
  LT_THROW(ErrorKind::kInternal, "this optimizer cannot update parameter ", param(i).name,
           " by rows");
}

Tensor param_rows(const Tensor& t, int64_t row0, const Tensor& grad_rows, const std::string& name) {
  LT_CHECK(t.dim() >= 1 && grad_rows.dim() == t.dim() && row0 >= 0 &&
               row0 + grad_rows.size(0) <= t.size(0),
           "update_rows: gradient ", grad_rows.str(), " at row ", row0, " for ", name, " ",
           t.str());
  for (int64_t d = 1; d < t.dim(); ++d)
    LT_CHECK(grad_rows.size(d) == t.size(d), "update_rows: gradient ", grad_rows.str(), " for ",
             name, " ", t.str());
  return t.narrow(0, row0, grad_rows.size(0));
}

void AdamW::update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr) {
  ensure_state(i);
  const AdamWTensor& s = state_[i];
  const std::string& name = params_[i].name;
  AdamWTensor t;
  t.param = param_rows(s.param, row0, grad_rows, name);
  t.grad = grad_rows.is_contiguous() ? grad_rows : grad_rows.contiguous();
  if (s.master.defined()) t.master = param_rows(s.master, row0, grad_rows, name);
  t.exp_avg = param_rows(s.exp_avg, row0, grad_rows, name);
  t.exp_avg_sq = param_rows(s.exp_avg_sq, row0, grad_rows, name);
  t.weight_decay = s.weight_decay;
  adamw_step({t}, AdamWStepArgs{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, step_, 1.0});
}

void AdamW::update(const std::vector<size_t>& which, double lr, double grad_scale) {
  std::vector<AdamWTensor> batch;
  for (size_t i : which) {
    Tensor g = params_[i].tensor.grad();
    if (!g.defined()) continue;
    ensure_state(i);
    AdamWTensor t = state_[i];
    t.grad = g.is_contiguous() ? g : g.contiguous();
    batch.push_back(t);
  }
  adamw_step(batch, AdamWStepArgs{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, step_, grad_scale});
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const AdamWTensor& s = state_[i];
    if (!s.exp_avg.defined()) continue;
    out.emplace_back(params_[i].name + ".exp_avg", s.exp_avg);
    out.emplace_back(params_[i].name + ".exp_avg_sq", s.exp_avg_sq);
    if (s.master.defined()) out.emplace_back(params_[i].name + ".master", s.master);
  }
  return out;
}

void load_state_entry(const std::unordered_map<std::string, Tensor>& saved, const std::string& key,
                      const Tensor& dst) {
  auto f = saved.find(key);
  LT_CHECK_INPUT(f != saved.end(), "optimizer state lacks '", key, "'");
  LT_CHECK_INPUT(f->second.shape() == dst.shape() && f->second.dtype() == dst.dtype(),
                 "optimizer state '", key, "' is ", f->second.str(), ", expected ", dst.str());
  ops::copy(dst, f->second);
}

void AdamW::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) {
  std::unordered_map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].name;
    if (!by_name.count(name + ".exp_avg")) continue;  // never updated before the checkpoint
    ensure_state(i);
    AdamWTensor& s = state_[i];
    load_state_entry(by_name, name + ".exp_avg", s.exp_avg);
    load_state_entry(by_name, name + ".exp_avg_sq", s.exp_avg_sq);
    if (s.master.defined()) load_state_entry(by_name, name + ".master", s.master);
  }
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (const AdamWTensor& s : state_) {
    if (s.exp_avg.defined()) b += s.exp_avg.nbytes() + s.exp_avg_sq.nbytes();
    if (s.master.defined()) b += s.master.nbytes();
  }
  return b;
}

Sgd::Sgd(std::vector<Param> params, double weight_decay)
    : params_(std::move(params)), master_(params_.size()), weight_decay_(weight_decay) {
  for (const Param& p : params_)
    LT_CHECK(dtype_is_floating(p.tensor.dtype()), "SGD parameter ", p.name, " is ",
             dtype_name(p.tensor.dtype()));
}

void Sgd::apply(const Tensor& p, const Tensor& w, const Tensor& g, bool decay, double lr,
                double grad_scale) const {
  Tensor gw = g;
  if (g.dtype() != w.dtype() || !g.is_contiguous()) {
    gw = Tensor::empty(w.shape(), w.dtype(), w.device(), MemTag::kWorkspace);
    ops::copy(gw, g);
  }
  // p - lr (gs g + wd p) = (1 - lr wd) p - (lr gs) g
  const double wd = decay ? weight_decay_ : 0.0;
  if (wd != 0.0) ops::scale_(w, 1.0 - lr * wd);
  ops::add_(w, gw, -lr * grad_scale);
  if (!w.shares_storage(p)) ops::copy(p, w);
}

void Sgd::update(const std::vector<size_t>& which, double lr, double grad_scale) {
  for (size_t i : which) {
    const Tensor& p = params_[i].tensor;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const bool wide = p.dtype() == DType::kF32 || p.dtype() == DType::kF64;
    if (!wide && !master_[i].defined()) {
      master_[i] = Tensor::empty(p.shape(), DType::kF32, p.device(), MemTag::kOptimizer);
      ops::copy(master_[i], p);
    }
    apply(p, wide ? p : master_[i], g, params_[i].decay, lr, grad_scale);
  }
}

void Sgd::update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr) {
  const Tensor& p = params_[i].tensor;
  const std::string& name = params_[i].name;
  const bool wide = p.dtype() == DType::kF32 || p.dtype() == DType::kF64;
  if (!wide && !master_[i].defined()) {
    master_[i] = Tensor::empty(p.shape(), DType::kF32, p.device(), MemTag::kOptimizer);
    ops::copy(master_[i], p);
  }
  const Tensor pr = param_rows(p, row0, grad_rows, name);
  apply(pr, wide ? pr : param_rows(master_[i], row0, grad_rows, name), grad_rows, params_[i].decay,
        lr, 1.0);
}

std::vector<std::pair<std::string, Tensor>> Sgd::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (master_[i].defined()) out.emplace_back(params_[i].name + ".master", master_[i]);
  return out;
}

void Sgd::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) {
  std::unordered_map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    const std::string key = params_[i].name + ".master";
    if (!by_name.count(key) || p.dtype() == DType::kF32 || p.dtype() == DType::kF64) continue;
    master_[i] = Tensor::empty(p.shape(), DType::kF32, p.device(), MemTag::kOptimizer);
    load_state_entry(by_name, key, master_[i]);
  }
}

int64_t Sgd::state_bytes() const {
  int64_t b = 0;
  for (const Tensor& m : master_)
    if (m.defined()) b += m.nbytes();
  return b;
}

OptimizerInBackward::OptimizerInBackward(Optimizer& opt, double lr) : opt_(opt), lr_(lr) {
  for (size_t i = 0; i < opt.num_params(); ++i) index_[opt.param(i).tensor.impl()] = i;
  add_backward_observer(this);
}

OptimizerInBackward::~OptimizerInBackward() { remove_backward_observer(this); }

void OptimizerInBackward::start() {
  if (started_) return;
  opt_.begin_step();
  started_ = true;
}

void OptimizerInBackward::after_node(Node& node) {
  auto* acc = dynamic_cast<AccumulateGrad*>(&node);
  if (!acc) return;
  auto it = index_.find(acc->leaf());
  if (it == index_.end()) return;
  Tensor p = opt_.param(it->second).tensor;
  const Tensor g = p.grad();
  if (!g.defined()) return;
  const double ss = ops::sum_squares(g);
  sum_squares_ += ss;
  if (std::isfinite(ss)) {
    start();
    opt_.update_param(it->second, lr_, 1.0);
    ++updated_;
  } else {
    finite_ = false;
  }
  p.zero_grad();
}

void OptimizerInBackward::apply_rows(const Tensor& p, int64_t row0, const Tensor& grad_rows) {
  auto it = index_.find(p.impl());
  LT_CHECK(it != index_.end(), "optimizer_in_backward: rows of a parameter the optimizer lacks");
  const double ss = ops::sum_squares(grad_rows);
  sum_squares_ += ss;
  if (!std::isfinite(ss)) {
    finite_ = false;
    return;
  }
  start();
  opt_.update_rows(it->second, row0, grad_rows, lr_);
  if (row0 == 0) ++updated_;
}

double OptimizerInBackward::grad_norm() const { return std::sqrt(sum_squares_); }

}  // namespace leantune
