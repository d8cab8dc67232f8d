// The host-offloaded optimizer (see optim_offload.h).
#include "engine/optim_offload.h"

#include <deque>
#include <unordered_map>

#include "engine/cuda_api.h"
#include "engine/ops.h"
#include "engine/stream.h"

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
  std::vector<size_t> todo;
  for (size_t i : which)
    if (params_[i].tensor.grad().defined()) todo.push_back(i);
  if (todo.empty()) return;
  if (params_[todo[0]].tensor.device().is_cuda()) {
    update_cuda(todo, lr, grad_scale);
    return;
  }
  for (size_t i : todo) {
    const Tensor& p = params_[i].tensor;
    const Tensor g = p.grad();
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

void OffloadedOptimizer::update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr) {
  inner_->set_step_count(step_);
  const Tensor& p = params_[i].tensor;
  const std::string& name = params_[i].name;
  Tensor host_grad = grad_rows;
  if (!grad_rows.device().is_cpu() || !grad_rows.is_contiguous()) {
    host_grad =
        Tensor::empty(grad_rows.shape(), grad_rows.dtype(), Device::cpu(), MemTag::kWorkspace);
    ops::copy(host_grad, grad_rows);
  }
  inner_->update_rows(i, row0, host_grad, lr);
  const Tensor dst = param_rows(p, row0, grad_rows, name);
  const Tensor src = param_rows(shadow_[i], row0, grad_rows, name);
  if (p.device().is_cpu()) {
    ops::copy(dst, src);
    return;
  }
  // Rounded on the host, then one copy of the parameter's dtype up.
  Tensor rounded = Tensor::empty(src.shape(), p.dtype(), Device::cpu(), MemTag::kWorkspace);
  ops::copy(rounded, src);
  ops::copy(dst, rounded);
}

void OffloadedOptimizer::update_cuda(const std::vector<size_t>& todo, double lr,
                                     double grad_scale) {
  struct Pending {
    size_t i;
    Tensor host_grad;
    std::unique_ptr<Event> ready;
  };
  const Device dev = params_[todo[0]].tensor.device();
  const Stream compute = current_stream(dev), copy = copy_stream(dev);
  // Everything queued so far (the gradients, the last reads of the weights) precedes the copies.
  copy.wait_stream(compute);
  std::deque<Pending> inflight;
  size_t next = 0;
  int64_t inflight_bytes = 0;
  // Gradient downloads are queued ahead, up to kOffloadWindowBytes, so that the copy engine works
  // while the CPU steps.
  auto issue = [&] {
    while (next < todo.size()) {
      const size_t i = todo[next];
      Tensor g = params_[i].tensor.grad();
      if (!g.is_contiguous()) g = g.contiguous();
      const int64_t bytes = static_cast<int64_t>(g.nbytes());
      if (!inflight.empty() && inflight_bytes + bytes > kOffloadWindowBytes) return;
      Pending p{i, Tensor::empty_pinned(g.shape(), g.dtype(), MemTag::kWorkspace),
                std::make_unique<Event>(dev)};
      cuda_memcpy_async(p.host_grad.data_ptr(), g.data_ptr(), g.nbytes(), CopyKind::kDeviceToHost,
                        copy.handle);
      p.ready->record(copy);
      g.storage()->record_stream(copy);  // a contiguous temporary dies before the copy ends
      inflight_bytes += bytes;
      inflight.push_back(std::move(p));
      ++next;
    }
  };
  issue();
  while (!inflight.empty()) {
    Pending p = std::move(inflight.front());
    inflight.pop_front();
    p.ready->synchronize();
    inflight_bytes -= static_cast<int64_t>(p.host_grad.nbytes());
    issue();
    const Tensor& param = params_[p.i].tensor;
    Tensor& s = shadow_[p.i];
    s.set_grad(p.host_grad);
    inner_->update_param(p.i, lr, grad_scale);
    s.zero_grad();
    // The weight goes back rounded to its dtype from pinned memory; the CPU moves on to the next
    // parameter while it uploads.
    Tensor up = Tensor::empty_pinned(param.shape(), param.dtype(), MemTag::kWorkspace);
    ops::copy(up, s);
    LT_CHECK(param.is_contiguous(), "offloaded optimizer: parameter ", params_[p.i].name, " ",
             param.str(), " is not contiguous");
    cuda_memcpy_async(param.data_ptr(), up.data_ptr(), up.nbytes(), CopyKind::kHostToDevice,
                      copy.handle);
    up.storage()->record_stream(copy);
  }
  // Kernels queued from now on read the updated weights.
  compute.wait_stream(copy);
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
