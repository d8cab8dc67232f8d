// Adafactor (Shazeer & Stern 2018) as transformers' Trainer builds it for optim="adafactor":
// transformers.optimization.Adafactor(lr=learning_rate, scale_parameter=False,
// relative_step=False) with its other defaults: eps = (1e-30, 1e-3), clip_threshold 1.0,
// decay_rate -0.8, beta1 None (no first moment), warmup_init False. Per parameter and step t:
//   g = grad_scale * grad (f32);  beta2t = 1 - t^-0.8;  u = g^2 + 1e-30
//   2-D [R, C] (factored): row = beta2t row + (1 - beta2t) mean_C(u)   [R]
//                          col = beta2t col + (1 - beta2t) mean_R(u)   [C]
//                          update = g / sqrt((row / mean(row)) (x) col)   (outer product)
//   1-D (not factored):    v = beta2t v + (1 - beta2t) u;  update = g / sqrt(v)
//   update /= max(rms(update) / clip_threshold, 1);  update *= lr
//   p = p - lr wd p (decoupled, when wd != 0);  p = p - update
// State: row and col (f32, R + C floats) or v (f32, n floats), tagged kOptimizer; the
// parameter is read as f32 and rounded back to its dtype (no master copy, as transformers).
// Built from engine ops (ops.h), so it runs wherever they run (CPU and CUDA). Parameters of
// more than two dimensions are refused (transformers factors the last two; no model here has
// one).
#pragma once

#include <string>
#include <vector>

#include "engine/optim.h"

namespace leantune {

struct AdafactorConfig {
  double eps1 = 1e-30;
  double clip_threshold = 1.0;
  double decay_rate = -0.8;
  double weight_decay = 0.0;
};

class Adafactor : public Optimizer {
 public:
  Adafactor(std::vector<Param> params, AdafactorConfig cfg);
  size_t num_params() const override { return params_.size(); }
  const Param& param(size_t i) const override { return params_[i]; }
  // "<name>.exp_avg_sq_row" and "<name>.exp_avg_sq_col" (2-D) or "<name>.exp_avg_sq" (1-D).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) override;
  int64_t state_bytes() const override;

 private:
  struct State {
    Tensor row, col, v;
  };
  void update(const std::vector<size_t>& which, double lr, double grad_scale) override;
  void ensure_state(size_t i);
  std::vector<Param> params_;
  AdafactorConfig cfg_;
  std::vector<State> state_;
};

}  // namespace leantune
