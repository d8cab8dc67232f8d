// The list of training algorithms (trainers/common/trainer_spec.h): adding one is its own folder
// plus its line here. Also the spec-driven pieces every algorithm shares: the demo's defaults
// and the model-for-dataset rule.
#include "engine/check.h"
#include "trainers/common/trainer_spec.h"

namespace leantune {

const std::vector<const TrainerSpec*>& trainer_specs() {
  static const std::vector<const TrainerSpec*> specs = {
      &sft_spec(),  &dpo_spec(),  &kto_spec(),        &reward_spec(),
      &grpo_spec(), &rloo_spec(), &online_dpo_spec(),
  };
  return specs;
}

const TrainerSpec* find_trainer_spec(const std::string& name) {
  for (const TrainerSpec* s : trainer_specs())
    if (s->name == name) return s;
  return nullptr;
}

void apply_demo_defaults(const TrainerSpec& spec, Options& o) {
  if (!o.get_string("model_name_or_path").empty() || !o.get_string("dataset").empty()) return;
  for (const auto& [key, value] : spec.demo_defaults)
    if (!o.is_set(key)) o.set(key, value);
}

std::vector<std::pair<std::string, nlohmann::json>> small_demo_defaults(const std::string& name) {
  return {{"max_length", 128},     {"per_device_train_batch_size", 8},
          {"learning_rate", 1e-3}, {"lr_scheduler_type", "constant"},
          {"max_steps", 40},       {"logging_steps", 5},
          {"save_steps", 0},       {"output_dir", "trainer_output/embedded_" + name}};
}

void check_model_for_dataset(const std::string& command, const Options& o) {
  LT_CHECK_INPUT(!o.get_string("model_name_or_path").empty() || o.get_string("dataset").empty(),
                 command, ": --model_name_or_path is required when --dataset is given");
}

}  // namespace leantune
