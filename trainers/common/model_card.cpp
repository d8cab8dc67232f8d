// The model card of a run's final model (see model_card.h), and the trainer's call that writes
// it (Trainer::write_model_card, trainer.h).
#include "trainers/common/model_card.h"

#include <cstdio>
#include <filesystem>

#include "loaders/fs_util.h"
#include "loaders/hub_cache.h"
#include "trainers/common/model_source.h"
#include "trainers/common/trainer.h"

namespace leantune {

namespace {

// TRL's trainer classes, named in the card.
std::string trl_trainer(const std::string& command) {
  if (command == "sft") return "SFTTrainer";
  if (command == "dpo") return "DPOTrainer";
  if (command == "kto") return "KTOTrainer";
  if (command == "reward") return "RewardTrainer";
  if (command == "grpo") return "GRPOTrainer";
  if (command == "rloo") return "RLOOTrainer";
  if (command == "online_dpo") return "OnlineDPOTrainer";
  return command;
}

std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

}  // namespace

std::string model_card(const ModelCardInfo& info) {
  // A Hub ID (the base was found in the Hugging Face cache) is linked, as TRL's card does.
  const bool hub_id = in_hub_cache(info.base_model);
  std::string s = "---\n";
  if (!info.base_model.empty()) s += "base_model: " + info.base_model + "\n";
  s += "library_name: " + std::string(info.adapter ? "peft" : "transformers") + "\n";
  s += "model_name: " + info.model_name + "\n";
  s += "tags:\n- generated_from_trainer\n- leantune\n- " + info.trainer + "\n";
  if (info.adapter) s += "- lora\n";
  s += "---\n\n# Model Card for " + info.model_name + "\n\n";
  std::string base = "the built-in demo model (randomly initialised)";
  if (hub_id)
    base = "[" + info.base_model + "](https://huggingface.co/" + info.base_model + ")";
  else if (!info.base_model.empty())
    base = "`" + info.base_model + "`";
  s += "This " + std::string(info.adapter ? "PEFT adapter" : "model") +
       " is a fine-tuned version of " + base + " on " +
       (info.dataset.empty() ? std::string("the built-in demo data") : "`" + info.dataset + "`") +
       ", trained with leantune's `" + info.trainer + "` trainer (TRL's " +
       trl_trainer(info.trainer) + " semantics) for " + std::to_string(info.steps) +
       " optimizer steps.\n\n";
  s += "## Training hyper-parameters\n\n| option | value |\n|---|---|\n";
  for (const auto& [name, value] : info.hyperparameters) s += "| " + name + " | " + value + " |\n";
  bool header = false;
  for (auto it = info.metrics.begin(); info.metrics.is_object() && it != info.metrics.end(); ++it) {
    if (!it.value().is_number() || it.key() == "step") continue;
    if (!header) s += "\n## Last logged metrics\n\n| metric | value |\n|---|---|\n";
    header = true;
    s += "| " + it.key() + " | " + number(it.value().get<double>()) + " |\n";
  }
  s += "\n## Framework versions\n\n- leantune: " + std::string(LEANTUNE_VERSION) + "\n";
  return s;
}

void Trainer::write_model_card(const std::string& dir, const nlohmann::json& last_logged) const {
  ModelCardInfo c;
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  c.model_name = p.filename().string();
  c.adapter = peft_.active();
  c.base_model = c.adapter ? base_model_name_or_path_ : model_source(options_).model_name_or_path;
  c.trainer = options_.command();
  c.dataset = train_stats().path;
  c.steps = step_;
  c.metrics = last_logged;
  // TrainingArguments' core, then every other option the user set (paths left out).
  const TrainingArguments& a = args_;
  c.hyperparameters = {
      {"learning_rate", number(a.learning_rate)},
      {"lr_scheduler_type", a.lr_scheduler_type},
      {"per_device_train_batch_size", std::to_string(a.per_device_train_batch_size)},
      {"gradient_accumulation_steps", std::to_string(a.gradient_accumulation_steps)},
      {"world_size", std::to_string(comm().size())},
      {a.max_steps > 0 ? "max_steps" : "num_train_epochs",
       a.max_steps > 0 ? std::to_string(a.max_steps) : number(a.num_train_epochs)},
      {"optim", a.optim},
      {"seed", std::to_string(a.seed)}};
  const nlohmann::json all = options_.to_json();
  for (auto it = all.begin(); it != all.end(); ++it) {
    const std::string& k = it.key();
    bool listed = false;
    for (const auto& [name, v] : c.hyperparameters) listed = listed || name == k;
    const bool path = k == "output_dir" || k == "dataset" || k == "eval_dataset" ||
                      k == "model_name_or_path" || k == "resume_from_checkpoint" ||
                      k == "memory_trace" || k == "ref_model" || k == "reward_command";
    if (!listed && !path && options_.is_set(k)) c.hyperparameters.push_back({k, it.value().dump()});
  }
  write_text_atomic(dir + "/README.md", model_card(c));
}

}  // namespace leantune
