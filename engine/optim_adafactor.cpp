// Adafactor's step (see optim_adafactor.h), composed from engine ops. Scratch: the f32
// gradient, its square and the update (each of the parameter's size, kWorkspace), freed after
// the parameter's update.
#include "engine/optim_adafactor.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "engine/ops.h"

namespace leantune {

Adafactor::Adafactor(std::vector<Param> params, AdafactorConfig cfg)
    : params_(std::move(params)), cfg_(cfg), state_(params_.size()) {
  for (const Param& p : params_) {
    LT_CHECK(dtype_is_floating(p.tensor.dtype()), "Adafactor parameter ", p.name, " is ",
             dtype_name(p.tensor.dtype()));
    LT_CHECK_INPUT(p.tensor.dim() <= 2, "optim adafactor: parameter ", p.name, " has shape ",
                   shape_str(p.tensor.shape()), " (at most 2 dimensions are supported)");
  }
}

void Adafactor::ensure_state(size_t i) {
  State& s = state_[i];
  if (s.row.defined() || s.v.defined()) return;
  const Tensor& p = params_[i].tensor;
  const Device d = p.device();
  if (p.dim() == 2) {
    s.row = Tensor::zeros({p.size(0)}, DType::kF32, d, MemTag::kOptimizer);
    s.col = Tensor::zeros({p.size(1)}, DType::kF32, d, MemTag::kOptimizer);
  } else {
    s.v = Tensor::zeros({p.numel()}, DType::kF32, d, MemTag::kOptimizer);
  }
}

void Adafactor::update(const std::vector<size_t>& which, double lr, double grad_scale) {
  const double beta2t = 1.0 - std::pow(static_cast<double>(step_), cfg_.decay_rate);
  for (size_t i : which) {
    const Tensor& p = params_[i].tensor;
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    ensure_state(i);
    State& s = state_[i];
    MemTagGuard scratch(MemTag::kWorkspace);
    Tensor g = Tensor::empty(p.shape(), DType::kF32, p.device());
    ops::copy(g, grad);
    if (grad_scale != 1.0) ops::scale_(g, grad_scale);
    const Tensor u = ops::affine(ops::unary(g, ops::Unary::kSquare), 1.0, cfg_.eps1);
    Tensor upd;
    if (p.dim() == 2) {
      const int64_t rows = p.size(0), cols = p.size(1);
      ops::scale_(s.row, beta2t);
      ops::add_(s.row, ops::sum_dim(u, 1), (1.0 - beta2t) / static_cast<double>(cols));
      ops::scale_(s.col, beta2t);
      ops::add_(s.col, ops::sum_dim(u, 0), (1.0 - beta2t) / static_cast<double>(rows));
      // (row / mean(row)) (x) col as an outer product, then g / sqrt(.).
      const double row_mean = ops::sum(s.row).to_f64()[0] / static_cast<double>(rows);
      const Tensor outer = ops::matmul(s.row.view({rows, 1}), s.col.view({1, cols}));
      ops::scale_(outer, 1.0 / row_mean);
      upd = ops::div(g, ops::unary(outer, ops::Unary::kSqrt));
    } else {
      ops::scale_(s.v, beta2t);
      ops::add_(s.v, u.view({p.numel()}), 1.0 - beta2t);
      upd = ops::div(g, ops::unary(s.v, ops::Unary::kSqrt).view(p.shape()));
    }
    const double rms = std::sqrt(ops::sum_squares(upd) / static_cast<double>(p.numel()));
    const double scale = lr / std::max(rms / cfg_.clip_threshold, 1.0);
    const bool wide = p.dtype() == DType::kF32 || p.dtype() == DType::kF64;
    Tensor w = p;
    if (!wide) {
      w = Tensor::empty(p.shape(), DType::kF32, p.device());
      ops::copy(w, p);
    }
    const double wd = params_[i].decay ? cfg_.weight_decay : 0.0;
    if (wd != 0.0) ops::scale_(w, 1.0 - wd * lr);
    if (w.dtype() != upd.dtype()) {
      Tensor cast = Tensor::empty(p.shape(), w.dtype(), p.device());
      ops::copy(cast, upd);
      upd = cast;
    }
    ops::add_(w, upd, -scale);
    if (!wide) ops::copy(p, w);
  }
}

std::vector<std::pair<std::string, Tensor>> Adafactor::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const State& s = state_[i];
    if (s.row.defined()) {
      out.emplace_back(params_[i].name + ".exp_avg_sq_row", s.row);
      out.emplace_back(params_[i].name + ".exp_avg_sq_col", s.col);
    } else if (s.v.defined()) {
      out.emplace_back(params_[i].name + ".exp_avg_sq", s.v);
    }
  }
  return out;
}

void Adafactor::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) {
  std::unordered_map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].name;
    const bool two_d = params_[i].tensor.dim() == 2;
    if (!by_name.count(name + (two_d ? ".exp_avg_sq_row" : ".exp_avg_sq"))) continue;
    ensure_state(i);
    State& s = state_[i];
    if (two_d) {
      load_state_entry(by_name, name + ".exp_avg_sq_row", s.row);
      load_state_entry(by_name, name + ".exp_avg_sq_col", s.col);
    } else {
      load_state_entry(by_name, name + ".exp_avg_sq", s.v);
    }
  }
}

int64_t Adafactor::state_bytes() const {
  int64_t b = 0;
  for (const State& s : state_)
    for (const Tensor* t : {&s.row, &s.col, &s.v})
      if (t->defined()) b += t->nbytes();
  return b;
}

}  // namespace leantune
