// The host-offloaded optimizer (see optim_offload.h).
#include "engine/optim_offload.h"

#include <unordered_map>

#include "engine/ops.h"

namespace leantune {

OffloadedOptimizer::OffloadedOptimizer(std::vector<Param> params, const MakeInner& make_inner)
    : params_(std::move(params)) {
  std::vector<Param> host;
  for (const Param& p : params_) {
    LT_CHECK(dtype_is_floating(p.tensor.dtype()), "offloaded optimizer: parameter ", p.name, " is ",
             dtype_name(p.tensor.dtype()));
    Tensor s = Tensor::empty(p.tensor.shape(), DType::kF32, Device::cpu(), MemTag::kOptimizer);
    ops::copy(s, p.tensor);
    shadow_.push_back(s);
    host.push_back({p.name, s, p.decay});
  }
  inner_ = make_inner(std::move(host));
}

void OffloadedOptimizer::update(const std::vector<size_t>& which, double lr, double grad_scale) {
  inner_->set_step_count(step_);
  for (size_t i : which) {
    const Tensor& p = params_[i].tensor;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor& s = shadow_[i];
    Tensor host_grad = g;
    if (!g.device().is_cpu() || !g.is_contiguous()) {
      host_grad = Tensor::empty(g.shape(), g.dtype(), Device::cpu(), MemTag::kWorkspace);
      ops::copy(host_grad, g);
    }
    s.set_grad(host_grad);
    inner_->update_param(i, lr, grad_scale);
    s.zero_grad();
    ops::copy(p, s);
  }
}

std::vector<std::pair<std::string, Tensor>> OffloadedOptimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out = inner_->state_tensors();
  for (size_t i = 0; i < params_.size(); ++i)
    out.emplace_back(params_[i].name + ".offload_master", shadow_[i]);
  return out;
}

void OffloadedOptimizer::load_state_tensors(
    const std::vector<std::pair<std::string, Tensor>>& state) {
  std::unordered_map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t i = 0; i < params_.size(); ++i)
    load_state_entry(by_name, params_[i].name + ".offload_master", shadow_[i]);
  inner_->load_state_tensors(state);
}

int64_t OffloadedOptimizer::state_bytes() const {
  int64_t b = inner_->state_bytes();
  for (const Tensor& s : shadow_) b += s.nbytes();
  return b;
}

}  // namespace leantune
