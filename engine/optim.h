// The optimizers of the engine behind one interface (Optimizer), and the two that need nothing
// beyond f32 arithmetic: AdamW and SGD. (bitsandbytes-compatible 8-bit AdamW is in
// kernels/optim_8bit.h; it needs the quantization maps of kernels/.)
//
// AdamW with decoupled weight decay (Loshchilov & Hutter; torch.optim.AdamW semantics):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p = p - lr * wd * p                      (decoupled decay, on the master value)
//   p = p - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// State (m, v) is f32 and tagged kOptimizer. A parameter stored in bf16/f16 keeps an f32 master
// copy (kOptimizer); the update runs on the master and the rounded value is written back to the
// parameter. f32 parameters are updated in place (no master). Gradients may be any float dtype;
// they are read as f32 (times grad_scale, for clipping).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "engine/autograd.h"
#include "engine/profile.h"
#include "engine/tensor.h"

namespace leantune {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// One tensor's view of the fused step. master may be undefined (param is f32 then).
struct AdamWTensor {
  Tensor param;
  Tensor grad;
  Tensor master;
  Tensor exp_avg;
  Tensor exp_avg_sq;
  double weight_decay = 0.0;
};

struct AdamWStepArgs {
  double lr;
  double beta1;
  double beta2;
  double eps;
  int64_t step;       // 1-based, for bias correction
  double grad_scale;  // multiplies every gradient (clipping)
};

// The fused multi-tensor update (one pass over each tensor's data).
void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWStepArgs& args);
void adamw_step_cpu(const std::vector<AdamWTensor>& tensors, const AdamWStepArgs& args);
void adamw_step_cuda(const std::vector<AdamWTensor>& tensors, const AdamWStepArgs& args);

struct OptimParam {
  std::string name;
  Tensor tensor;
  bool decay = true;  // biases and norms are usually excluded from weight decay
};

// What a trainer drives. The step count is the number of updates applied (bias corrections).
class Optimizer {
 public:
  using Param = OptimParam;
  virtual ~Optimizer() = default;
  // Applies one update from each parameter's .grad() (parameters without a gradient are
  // skipped). lr is the scheduler's value; grad_scale multiplies every gradient (clipping).
  void step(double lr, double grad_scale = 1.0);
  // The same update, one parameter at a time (optimizer_in_backward): begin_step() counts the
  // update, then update_param(i, ...) applies it to parameter i (index into the constructor's
  // list) from its .grad(). Per element the arithmetic is step()'s.
  void begin_step() { ++step_; }
  void update_param(size_t i, double lr, double grad_scale = 1.0) {
    ProfileScope prof(OpKind::kOptimizer, param(i).tensor.device());
    update({i}, lr, grad_scale);
  }
  // Rows [row0, row0 + n) of parameter i (along its first dimension) from grad_rows, shaped as
  // those rows, at step_count() with grad_scale 1: per element the arithmetic of update_param.
  // For the LM head updated block by block inside the fused loss, whose whole gradient never
  // exists. Optimizers whose state does not split by rows (adafactor's factored moment) keep the
  // default: supports_row_updates() false, and update_rows an Error.
  virtual bool supports_row_updates() const { return false; }
  virtual void update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr);
  virtual size_t num_params() const = 0;
  virtual const Param& param(size_t i) const = 0;
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  // State for checkpoints, "<param name>.<part>" -> tensor (only parameters updated so far).
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() const = 0;
  // Restores from tensors saved by state_tensors(); missing or mis-shaped entries are an Error.
  virtual void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) = 0;
  // Bytes of optimizer state held (master copies included).
  virtual int64_t state_bytes() const = 0;

 protected:
  // Updates the listed parameters (all with a gradient) at step_count().
  virtual void update(const std::vector<size_t>& which, double lr, double grad_scale) = 0;
  int64_t step_ = 0;
};

// The rows [row0, row0 + n) of t (a parameter or a state shaped like it) along its first
// dimension, n = grad_rows.size(0), after checking that grad_rows is shaped as those rows.
Tensor param_rows(const Tensor& t, int64_t row0, const Tensor& grad_rows, const std::string& name);

// Copies saved[name + suffix] into dst; a missing or mis-shaped/mis-typed entry is an
// Error(kInput) naming it.
void load_state_entry(const std::unordered_map<std::string, Tensor>& saved, const std::string& key,
                      const Tensor& dst);

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Param> params, AdamWConfig cfg);

  const AdamWConfig& config() const { return cfg_; }
  size_t num_params() const override { return params_.size(); }
  const Param& param(size_t i) const override { return params_[i]; }

  // "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.master".
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) override;
  int64_t state_bytes() const override;
  bool supports_row_updates() const override { return true; }
  void update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr) override;

 private:
  void update(const std::vector<size_t>& which, double lr, double grad_scale) override;
  void ensure_state(size_t i);
  std::vector<Param> params_;
  AdamWConfig cfg_;
  std::vector<AdamWTensor> state_;
};

// SGD as torch.optim.SGD without momentum (transformers' "sgd"): weight decay is L2, added to
// the gradient:  g' = grad_scale g + wd p;  p = p - lr g'.  A bf16/f16 parameter keeps an f32
// master copy (kOptimizer, "<name>.master"), as AdamW does; f32/f64 ones are updated in place.
class Sgd : public Optimizer {
 public:
  Sgd(std::vector<Param> params, double weight_decay);
  size_t num_params() const override { return params_.size(); }
  const Param& param(size_t i) const override { return params_[i]; }
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) override;
  int64_t state_bytes() const override;
  bool supports_row_updates() const override { return true; }
  void update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr) override;

 private:
  void update(const std::vector<size_t>& which, double lr, double grad_scale) override;
  // The SGD update of w (param or its master) from g; p gets the rounded value when w is a master.
  void apply(const Tensor& p, const Tensor& w, const Tensor& g, bool decay, double lr,
             double grad_scale) const;
  std::vector<Param> params_;
  std::vector<Tensor> master_;
  double weight_decay_;
};

// optimizer_in_backward (torchtune's optimizer_in_bwd): while it lives it observes backward;
// when the AccumulateGrad node of one of the optimizer's parameters has run, that gradient is
// complete (the engine runs a leaf's AccumulateGrad once, after every consumer), so the
// parameter is updated at once (Optimizer::update_param, grad_scale 1) and its gradient dropped.
// No full-model gradient buffer exists: at most the gradients in flight plus one parameter's.
// The update is counted (begin_step) when the first gradient is applied. A gradient with a
// non-finite value is not applied (and dropped); finite() then reports false. Only for one backward
// per update (no accumulation) and no clipping by the global norm: the trainer refuses those
// combinations.
class OptimizerInBackward final : public BackwardObserver {
 public:
  OptimizerInBackward(Optimizer& opt, double lr);
  ~OptimizerInBackward() override;
  OptimizerInBackward(const OptimizerInBackward&) = delete;
  OptimizerInBackward& operator=(const OptimizerInBackward&) = delete;
  void after_node(Node& node) override;
  // The global norm of the gradients seen (for logs), whether all were finite, how many
  // parameters were updated.
  double grad_norm() const;
  bool finite() const { return finite_; }
  int64_t updated() const { return updated_; }
  // Whether the optimizer takes blocks of rows (Optimizer::supports_row_updates).
  bool takes_rows() const { return opt_.supports_row_updates(); }
  // A block of rows of parameter p's gradient handed out before backward (the LM head from the
  // fused loss, kernels/linear_cross_entropy.h): applied at once with update_rows and counted in
  // grad_norm(); a non-finite block is not applied and finite() reports false. p must be one of
  // the optimizer's parameters.
  void apply_rows(const Tensor& p, int64_t row0, const Tensor& grad_rows);

 private:
  // The update is counted (begin_step) when the first gradient is applied.
  void start();
  Optimizer& opt_;
  bool started_ = false;
  double lr_;
  std::unordered_map<const TensorImpl*, size_t> index_;
  double sum_squares_ = 0.0;
  bool finite_ = true;
  int64_t updated_ = 0;
};

}  // namespace leantune
