// The optimizer options of every trainer (transformers' names) and the optimizer they build.
//
//   optim  adamw_torch (torch.optim.AdamW: f32 moments, an f32 master copy of 16-bit weights;
//          engine/optim.h), adamw_8bit / adamw_bnb_8bit (bitsandbytes AdamW8bit: 8-bit blockwise
//          moments, no master: bf16 weights written back with stochastic rounding;
//          kernels/optim_8bit.h), adafactor (transformers' Adafactor as its
//          Trainer builds it: factored second moment, no first moment; engine/optim_adafactor.h),
//          sgd (torch.optim.SGD without momentum). The betas, epsilon and weight decay options
//          apply to the AdamW variants; sgd uses weight_decay (L2).
//   optimizer_in_backward  torchtune's optimizer_in_bwd: each parameter is updated as soon as its
//          gradient is complete, and the gradient dropped (engine/optim.h OptimizerInBackward);
//          the same arithmetic as the step after backward. Refused (exit 2) with
//          gradient_accumulation_steps > 1 or max_grad_norm > 0 (clipping needs every
//          gradient before any update).
//   offload_optimizer  none | cpu (DeepSpeed ZeRO-Offload's idea): f32 master weights and the
//          optimizer's states in host memory, the step on the CPU; the device keeps only the
//          parameters in their compute dtype (engine/optim_offload.h). Works with every optim.
// A checkpoint records the optim it was written with; resuming under another is refused.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/optim.h"
#include "loaders/option_table.h"

namespace leantune {

struct OptimArguments {
  std::string optim = "adamw_torch";
  bool optimizer_in_backward = false;
  std::string offload_optimizer = "none";
};

// optim, optimizer_in_backward and offload_optimizer (part of the training table).
const OptionTable<OptimArguments>& optim_table();
// Refuses contradictory combinations, with the training options they meet.
void check_optim_arguments(const OptimArguments& a, int64_t gradient_accumulation_steps,
                           double max_grad_norm);

// Whether the optimizer `optim` names updates blocks of rows (Optimizer::supports_row_updates):
// under optimizer_in_backward, sft then updates an untied LM head block by block inside the
// fused loss. For the estimate, which builds no optimizer; a test keeps it equal to the classes.
bool optim_updates_rows(const std::string& optim);

// The optimizer `a.optim` names over `params` (cfg: lr, betas, epsilon, weight decay).
std::unique_ptr<Optimizer> make_optimizer(const OptimArguments& a,
                                          std::vector<Optimizer::Param> params,
                                          const AdamWConfig& cfg);

}  // namespace leantune
