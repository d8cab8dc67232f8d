// trainer_bin estimate reward: see estimate_reward.h.
#include "trainers/estimate/estimate_reward.h"

#include <cstdio>

#include "engine/checked_int.h"
#include "trainers/common/metrics.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/common/trainer.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/reward/reward.h"
#include "trainers/sft/sft.h"

namespace leantune {

EstimateConfig reward_estimate_config(const Options& o, const ModelConfig& model, bool cpu) {
  const TrainingArguments args = training_arguments(o);
  LT_CHECK_INPUT(args.cp_size == 1, "option cp_size ", args.cp_size,
                 ": this trainer does not split sequences over ranks (",
                 context_parallel_trainer_names(), " have context parallelism)");
  PeftArguments peft = peft_table().read(o);
  peft.config.modules_to_save.push_back("score");
  const QuantConfig quant = quant_config_from_options(o, args.bf16 ? DType::kBF16 : DType::kF32);
  const ModelConfig cls =
      model.sequence_classification ? model : model.as_sequence_classification(1);
  const int64_t max_length = reward_table().read(o).max_length.value_or(0);
  const int64_t length = max_length > 0 ? max_length : cls.max_position_embeddings;
  return estimate_config(cls, args, peft.use_peft ? &peft.config : nullptr, quant, false,
                         max_length, cpu,
                         (CheckedInt(2) * args.per_device_train_batch_size * length).get(), length);
}

int run_estimate_reward(const std::vector<std::string>& args) {
  Options o = reward_options("estimate reward");
  const std::optional<EstimateTarget> t = parse_estimate_target(o, args);
  if (!t) return 0;
  const std::string& path = t->path;
  const ModelConfig& model = t->model;
  const bool cpu = t->device.is_cpu();
  const EstimateConfig c = reward_estimate_config(o, model, cpu);
  const MemoryEstimate e = estimate_memory(c);
  std::printf(
      "reward estimate for %s (%s, %lld parameters, %lld trainable) on %s, %s, %lld tokens per "
      "micro-batch (chosen + rejected):\n",
      path.c_str(), c.model.architecture.c_str(), static_cast<long long>(e.total_parameters),
      static_cast<long long>(e.trainable_parameters), cpu ? "cpu" : "cuda", dtype_name(c.dtype),
      static_cast<long long>(c.micro_batch_tokens));
  const std::pair<const char*, int64_t> rows[] = {
      {"params", e.params},           {"grads", e.grads},      {"optimizer states", e.optimizer},
      {"activations", e.activations}, {"loss (held)", e.loss}, {"workspace at peak", e.workspace}};
  for (const auto& [what, bytes] : rows)
    std::printf("  %-22s %12s\n", what, format_bytes(bytes).c_str());
  if (e.optimizer_host > 0)
    std::printf("  %-22s %12s  (host memory, not in the peak)\n", "optimizer on the host",
                format_bytes(e.optimizer_host).c_str());
  std::printf("  %-22s %12s  (during %s, %s)\n", "peak", format_bytes(e.peak).c_str(),
              e.peak_phase.c_str(), e.peak_detail.c_str());
  return 0;
}

}  // namespace leantune
