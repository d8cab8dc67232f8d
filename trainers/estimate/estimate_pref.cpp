// Preference runs' memory estimate: see the header.
#include "trainers/estimate/estimate_pref.h"

#include <cstdio>
#include <filesystem>

#include "engine/allocator.h"
#include "engine/checked_int.h"
#include "models/peft_io.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/dpo/dpo.h"
#include "trainers/kto/kto.h"

namespace leantune {

nlohmann::json PreferenceEstimate::to_json() const {
  nlohmann::json j = policy.to_json();
  j["params"] = (CheckedInt(policy.params) + reference_params).get();
  j["peak"] = peak;
  j["rss_peak"] =
      (CheckedInt(policy.rss_peak) + (policy.rss_peak > 0 ? reference_params : 0)).get();
  j["reference_mode"] = reference_mode;
  j["reference_params"] = reference_params;
  return j;
}

int64_t reference_param_bytes(const std::string& mode, const ModelConfig& policy,
                              const ModelConfig& ref, bool bf16, bool ref_4bit, bool ref_8bit) {
  if (mode == "precomputed" || mode == "adapters_off" || mode == "initial_adapter") return 0;
  EstimateConfig c;
  c.model = mode == "ref_model" ? ref : policy;
  c.dtype = bf16 ? DType::kBF16 : DType::kF32;
  c.load_in_4bit = mode == "ref_model" && ref_4bit;
  c.load_in_8bit = mode == "ref_model" && ref_8bit;
  c.micro_batch_tokens = 1;
  c.max_seqlen = 1;
  return estimate_memory(c).params;
}

PreferenceEstimate estimate_preference(const EstimateConfig& policy, const std::string& mode,
                                       int64_t reference_params) {
  PreferenceEstimate e;
  e.policy = estimate_memory(policy);
  e.reference_mode = mode;
  e.reference_params = reference_params;
  e.peak = (CheckedInt(e.policy.peak) + reference_params).get();
  return e;
}

namespace {

std::string dpo_ref_mode(const RefModelConfig& ref, bool use_peft) {
  if (ref.precompute) return "precomputed";
  if (!ref.ref_model.empty()) return "ref_model";
  return use_peft ? "adapters_off" : "policy_copy";
}

// The --ref_model's config.json, else the policy's.
ModelConfig ref_config(const std::string& dir, const ModelConfig& policy) {
  if (dir.empty()) return policy;
  const std::filesystem::path cfg = std::filesystem::path(dir) / "config.json";
  return std::filesystem::exists(cfg) ? ModelConfig::load(cfg.string()) : policy;
}

// The options of the micro-batch's shape: dpo's (2 sequences per example) or kto's (1).
struct PreferenceShape {
  std::optional<int64_t> max_length;  // none: no limit
  bool use_liger_loss = true;
};
PreferenceShape preference_shape(const Options& o, int64_t sequences_per_example) {
  if (sequences_per_example == 2) {
    const DpoArguments a = dpo_table().read(o);
    return {a.max_length, a.use_liger_loss};
  }
  const KtoArguments a = kto_table().read(o);
  return {a.max_length, a.use_liger_loss};
}

}  // namespace

PreferenceEstimate estimate_dpo_from_options(const Options& o, const ModelConfig& model, bool cpu) {
  return estimate_preference_from_options(o, model, cpu, 2);
}

PreferenceEstimate estimate_preference_from_options(const Options& o, const ModelConfig& model,
                                                    bool cpu, int64_t sequences_per_example) {
  const TrainingArguments args = training_arguments(o);
  LT_CHECK_INPUT(args.cp_size == 1, "option cp_size ", args.cp_size,
                 ": the preference estimate does not model the ring yet (trainer_bin dpo and kto "
                 "run it; trainer_bin estimate --cp_size models sft)");
  const PeftArguments peft = peft_table().read(o);
  const RefModelConfig ref = ref_model_table().read(o);
  const QuantConfig quant = quant_config_from_options(o, args.bf16 ? DType::kBF16 : DType::kF32);
  const PreferenceShape shape = preference_shape(o, sequences_per_example);
  const int64_t max_length = shape.max_length.value_or(0);
  const int64_t length = max_length > 0 ? max_length : model.max_position_embeddings;
  // DPO: chosen and rejected of every pair in one micro-batch. KTO: the matched sequences (its
  // KL sequences run without gradient and keep nothing, below the policy's peak).
  const EstimateConfig c = estimate_config(
      model, args, peft.use_peft ? &peft.config : nullptr, quant, shape.use_liger_loss, max_length,
      cpu, (CheckedInt(sequences_per_example) * args.per_device_train_batch_size * length).get(),
      length);
  const std::string mode = dpo_ref_mode(ref, peft.use_peft);
  return estimate_preference(c, mode,
                             reference_param_bytes(mode, model, ref_config(ref.ref_model, model),
                                                   args.bf16, ref.ref_load_in_4bit));
}

int run_estimate_dpo(const std::vector<std::string>& args) {
  return run_estimate_preference(args, "dpo");
}

int run_estimate_preference(const std::vector<std::string>& args, const std::string& trainer) {
  const bool dpo = trainer == "dpo";
  const int64_t per_example = dpo ? 2 : 1;
  Options o = dpo ? dpo_options("estimate dpo") : kto_options("estimate kto");
  const std::optional<EstimateTarget> t = parse_estimate_target(o, args);
  if (!t) return 0;
  const std::string& path = t->path;
  const ModelConfig& model = t->model;
  const bool cpu = t->device.is_cpu();
  const PreferenceEstimate e = estimate_preference_from_options(o, model, cpu, per_example);
  const TrainingArguments training = training_table().read(o);
  const bool use_peft = peft_table().read(o).use_peft;
  std::printf(
      "%s estimate for %s (%lld parameters) on %s, %lld tokens per micro-batch (%s):\n",
      trainer.c_str(), path.c_str(), static_cast<long long>(e.policy.total_parameters),
      cpu ? "cpu" : "cuda",
      static_cast<long long>(
          (CheckedInt(per_example) * training.per_device_train_batch_size *
           preference_shape(o, per_example).max_length.value_or(model.max_position_embeddings))
              .get()),
      dpo ? "chosen + rejected" : "the matched sequences; the KL ones run without grad");
  std::printf("  %-26s %12s\n", "policy params", format_bytes(e.policy.params).c_str());
  std::printf("  %-26s %12s\n", "grads", format_bytes(e.policy.grads).c_str());
  std::printf("  %-26s %12s\n", "optimizer states", format_bytes(e.policy.optimizer).c_str());
  std::printf("  %-26s %12s\n", "activations", format_bytes(e.policy.activations).c_str());
  std::printf("  %-26s %12s\n", "loss (held)", format_bytes(e.policy.loss).c_str());
  std::printf("  %-26s %12s\n", "workspace at peak", format_bytes(e.policy.workspace).c_str());
  std::printf("  %-26s %12s  (%s)\n", "reference weights", format_bytes(e.reference_params).c_str(),
              e.reference_mode.c_str());
  std::printf("  %-26s %12s  (during %s, %s)\n", "peak", format_bytes(e.peak).c_str(),
              e.policy.peak_phase.c_str(), e.policy.peak_detail.c_str());
  // The other reference modes of the same run, for comparison.
  std::printf("reference modes:\n");
  const ModelConfig ref = ref_config(ref_model_table().read(o).ref_model, model);
  const bool bf16 = training.bf16;
  for (const char* mode : {"precomputed", "adapters_off", "policy_copy", "ref_model"}) {
    const std::string m = mode;
    if (m == "adapters_off" && !use_peft) continue;
    if (m == "policy_copy" && use_peft) continue;
    const int64_t r = reference_param_bytes(m, model, ref, bf16, false);
    std::printf("  %-26s %12s reference, peak %s\n", mode, format_bytes(r).c_str(),
                format_bytes((CheckedInt(e.policy.peak) + r).get()).c_str());
    if (m == "ref_model") {
      const int64_t q = reference_param_bytes(m, model, ref, bf16, true);
      std::printf("  %-26s %12s reference, peak %s\n", "ref_model (ref_load_in_4bit)",
                  format_bytes(q).c_str(),
                  format_bytes((CheckedInt(e.policy.peak) + q).get()).c_str());
    }
  }
  return 0;
}

}  // namespace leantune
