// Step cost of a change of options (see step_cost.h).
#include "trainers/estimate/step_cost.h"

#include "engine/device_peaks.h"

namespace leantune {

StepCost step_cost(const EstimateConfig& c, const MemoryEstimate& e, const EstimateConfig& base) {
  StepCost s;
  const double n = static_cast<double>(e.total_parameters);
  const double per_token =
      training_flops_per_token(n, static_cast<double>(e.trainable_parameters)) +
      (c.gradient_checkpointing ? 2.0 * n : 0.0);
  const double tokens = static_cast<double>(c.micro_batch_tokens) /
                        static_cast<double>(c.cp_size > 0 ? c.cp_size : 1) *
                        static_cast<double>(c.gradient_accumulation_steps);
  s.flops = per_token * tokens;
  auto adds = [&](bool now, bool before, const char* what) {
    if (now && !before) s.unmodelled.push_back(what);
  };
  adds(c.activation_offloading, base.activation_offloading, "activation copies to the host");
  adds(c.offload_optimizer, base.offload_optimizer, "the optimizer step on the host");
  adds(c.optim.rfind("paged_", 0) == 0, base.optim.rfind("paged_", 0) == 0,
       "paged optimizer states");
  adds(c.load_in_4bit || c.load_in_8bit, base.load_in_4bit || base.load_in_8bit,
       "dequantizing the base weights");
  adds(c.micro_batch_tokens < base.micro_batch_tokens, false, "smaller GEMMs");
  return s;
}

}  // namespace leantune
