// The list of training algorithms (trainers/common/trainer_spec.h): adding one is its own folder
// (which defines `const TrainerSpec& <name>_spec()`) plus its line in LT_TRAINERS. Also the
// spec-driven pieces every algorithm shares: the demo's defaults, the model-for-dataset rule and
// the names of the context-parallel trainers.
#include <cstdio>

#include "engine/check.h"
#include "trainers/common/trainer_spec.h"

// In the order trainer_bin --help lists them.
#define LT_TRAINERS(X) \
  X(sft)               \
  X(dpo)               \
  X(kto)               \
  X(reward)            \
  X(grpo)              \
  X(rloo)              \
  X(online_dpo)        \
  X(distill)

namespace leantune {

#define LT_DECLARE_SPEC(name) const TrainerSpec& name##_spec();
LT_TRAINERS(LT_DECLARE_SPEC)
#undef LT_DECLARE_SPEC

const std::vector<const TrainerSpec*>& trainer_specs() {
#define LT_SPEC_ADDRESS(name) &name##_spec(),
  static const std::vector<const TrainerSpec*> specs = {LT_TRAINERS(LT_SPEC_ADDRESS)};
#undef LT_SPEC_ADDRESS
  return specs;
}

const TrainerSpec* find_trainer_spec(const std::string& name) {
  for (const TrainerSpec* s : trainer_specs())
    if (s->name == name) return s;
  return nullptr;
}

std::string context_parallel_trainer_names() {
  std::vector<std::string> names;
  for (const TrainerSpec* s : trainer_specs())
    if (s->context_parallel) names.push_back(s->name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return out;
}

void apply_demo_defaults(const TrainerSpec& spec, Options& o) {
  const ModelSource src = model_source(o);
  if (!src.model_name_or_path.empty() || !src.dataset.empty()) return;
  for (const auto& [key, value] : spec.demo_defaults)
    if (!o.is_set(key)) o.set(key, value);
}

std::vector<std::pair<std::string, nlohmann::json>> small_demo_defaults(const std::string& name) {
  return {{"max_length", 128},     {"per_device_train_batch_size", 8},
          {"learning_rate", 1e-3}, {"lr_scheduler_type", "constant"},
          {"max_steps", 40},       {"logging_steps", 5},
          {"save_steps", 0},       {"output_dir", "trainer_output/embedded_" + name}};
}

std::string summary_line(const TrainerSpec& spec, const nlohmann::json& last) {
  std::string out;
  for (const auto& [name, decimals] : spec.summary_metrics) {
    const nlohmann::json v = last.value(name, nlohmann::json());
    char value[64];
    std::snprintf(value, sizeof value, "%.*f", decimals, v.is_number() ? v.get<double>() : 0.0);
    out += ", " + name + " " + value;
  }
  return out;
}

void check_model_for_dataset(const std::string& command, const Options& o) {
  const ModelSource src = model_source(o);
  LT_CHECK_INPUT(!src.model_name_or_path.empty() || src.dataset.empty(), command,
                 ": --model_name_or_path is required when --dataset is given");
}

}  // namespace leantune
