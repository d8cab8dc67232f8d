// Optimizer offload to the host (DeepSpeed ZeRO-Offload's idea; --offload_optimizer cpu): the
// f32 master weights and every optimizer state live in host memory, the step runs on the CPU
// (OpenMP), and the device keeps only the parameters in their compute dtype (bf16).
//
// Each trained parameter P (any device) has a host f32 shadow S (tag kOptimizer on the host
// allocator), initialised from P. The inner optimizer (any of engine/optim.h's kind, built by
// the caller over the shadows) updates S from P's gradient copied to the host; then P = S,
// rounded to P's dtype. For a bf16 P this is adamw_torch's arithmetic exactly (its master is
// the shadow), so on the CPU a run gives bit-identical results; on CUDA the difference is where
// the step runs, not what it computes. The gradient copy is a scratch buffer (kWorkspace) freed
// after each parameter.
// On CUDA the copies are asynchronous, on one copy stream per device, through pinned host
// buffers: the gradients' downloads are queued ahead (up to kOffloadWindowBytes in flight) so
// that the copy engine works while the CPU steps, and each weight's upload (rounded on the host
// into a pinned buffer of its dtype) overlaps the CPU step of the next parameter. The compute
// stream waits for the uploads before anything queued after the step.
// Checkpoint state: the inner optimizer's tensors plus "<name>.offload_master" (the shadows).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/optim.h"

namespace leantune {

inline constexpr int64_t kOffloadWindowBytes = int64_t{256} << 20;

class OffloadedOptimizer : public Optimizer {
 public:
  using MakeInner = std::function<std::unique_ptr<Optimizer>(std::vector<Param> host_params)>;
  OffloadedOptimizer(std::vector<Param> params, const MakeInner& make_inner);
  size_t num_params() const override { return params_.size(); }
  const Param& param(size_t i) const override { return params_[i]; }
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) override;
  // Host bytes: the shadows and the inner optimizer's states.
  int64_t state_bytes() const override;
  // Row blocks: the gradient rows come to the host, the inner optimizer updates the shadow's
  // rows, and the rows go back rounded to the parameter's dtype (synchronous copies).
  bool supports_row_updates() const override { return inner_->supports_row_updates(); }
  void update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr) override;

 private:
  void update(const std::vector<size_t>& which, double lr, double grad_scale) override;
  void update_cuda(const std::vector<size_t>& todo, double lr, double grad_scale);
  std::vector<Param> params_;
  std::vector<Tensor> shadow_;
  std::unique_ptr<Optimizer> inner_;
};

}  // namespace leantune
