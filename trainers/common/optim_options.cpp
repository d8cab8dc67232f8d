// The optimizer options and the optimizer they build (see optim_options.h).
#include "trainers/common/optim_options.h"

#include "engine/check.h"
#include "engine/optim_adafactor.h"
#include "engine/optim_offload.h"
#include "kernels/optim_8bit.h"

namespace leantune {

const OptionTable<OptimArguments>& optim_table() {
  using A = OptimArguments;
  static const OptionTable<A> t =
      OptionTable<A>()
          .text("optim", &A::optim,
                "optimizer: adamw_torch (f32 states, 8 bytes/param + f32 master of 16-bit "
                "weights), adamw_8bit = adamw_bnb_8bit (bitsandbytes 8-bit states, ~2 "
                "bytes/param, no master), paged_adamw_8bit / paged_adamw_32bit (bitsandbytes' "
                "paged AdamW: states in pinned host memory, paged through the device in slabs "
                "for the step), adafactor (transformers' Adafactor: factored second moment, no "
                "first moment), sgd (no momentum, L2 weight decay)",
                {"adamw_torch", "adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit",
                 "paged_adamw_32bit", "adafactor", "sgd"})
          .flag("optimizer_in_backward", &A::optimizer_in_backward,
                "update each parameter as soon as its gradient is complete and free the "
                "gradient (no full-model gradient buffer; needs gradient_accumulation_steps 1 "
                "and max_grad_norm 0)")
          .text("offload_optimizer", &A::offload_optimizer,
                "cpu: f32 master weights and optimizer states in host memory, step on the CPU "
                "(the device keeps only the compute-dtype weights)",
                {"none", "cpu"});
  return t;
}

void check_optim_arguments(const OptimArguments& a, int64_t gradient_accumulation_steps,
                           double max_grad_norm) {
  LT_CHECK_INPUT(a.offload_optimizer != "cpu" || a.optim.rfind("paged_", 0) != 0,
                 "options offload_optimizer cpu and optim ", a.optim,
                 " contradict: offloading already keeps the states on the host (use optim ",
                 a.optim == "paged_adamw_8bit" ? "adamw_8bit" : "adamw_torch", ")");
  if (!a.optimizer_in_backward) return;
  LT_CHECK_INPUT(gradient_accumulation_steps == 1,
                 "option optimizer_in_backward cannot combine with gradient_accumulation_steps ",
                 gradient_accumulation_steps,
                 " (each gradient is applied as soon as it is complete)");
  LT_CHECK_INPUT(max_grad_norm == 0.0,
                 "option optimizer_in_backward cannot combine with clipping by the global norm "
                 "(max_grad_norm ",
                 max_grad_norm, "): pass --max_grad_norm 0");
}

namespace {
std::unique_ptr<Optimizer> make_plain(const std::string& optim,
                                      std::vector<Optimizer::Param> params,
                                      const AdamWConfig& cfg) {
  if (optim == "adamw_torch") return std::make_unique<AdamW>(std::move(params), cfg);
  if (optim == "adamw_8bit" || optim == "adamw_bnb_8bit")
    return std::make_unique<kernels::AdamW8bit>(std::move(params), cfg);
  if (optim == "paged_adamw_8bit")
    return std::make_unique<kernels::AdamW8bit>(std::move(params), cfg,
                                                kernels::AdamW8bitOptions{true, true});
  if (optim == "paged_adamw_32bit")
    return std::make_unique<kernels::AdamW8bit>(std::move(params), cfg,
                                                kernels::AdamW8bitOptions{false, true});
  if (optim == "adafactor")
    return std::make_unique<Adafactor>(std::move(params),
                                       AdafactorConfig{1e-30, 1.0, -0.8, cfg.weight_decay});
  if (optim == "sgd") return std::make_unique<Sgd>(std::move(params), cfg.weight_decay);
  LT_THROW(ErrorKind::kInput, "option optim: unknown optimizer '", optim, "'");
}
}  // namespace

bool optim_updates_rows(const std::string& optim) { return optim != "adafactor"; }

std::unique_ptr<Optimizer> make_optimizer(const OptimArguments& a,
                                          std::vector<Optimizer::Param> params,
                                          const AdamWConfig& cfg) {
  if (a.offload_optimizer == "cpu")
    return std::make_unique<OffloadedOptimizer>(std::move(params),
                                                [&](std::vector<Optimizer::Param> host) {
                                                  return make_plain(a.optim, std::move(host), cfg);
                                                });
  return make_plain(a.optim, std::move(params), cfg);
}

}  // namespace leantune
