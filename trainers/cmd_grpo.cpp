// trainer_bin grpo, rloo and online_dpo: the online trainers (TRL GRPOTrainer / RLOOTrainer
// / OnlineDPOTrainer options). With no model and no dataset: the built-in demo model on the
// built-in arithmetic task (trainers/grpo.h).
#include <cstdio>

#include "trainers/commands.h"
#include "trainers/grpo.h"
#include "trainers/preference_command.h"

namespace leantune {
namespace {

OnlineRun make_grpo_run(const Options& o) { return make_online_run("grpo", o); }
OnlineRun make_rloo_run(const Options& o) { return make_online_run("rloo", o); }
OnlineRun make_online_dpo_run(const Options& o) { return make_online_run("online_dpo", o); }

std::string reward_summary(const nlohmann::json& last) {
  char s[96];
  const nlohmann::json r = last.value("reward", nlohmann::json());
  std::snprintf(s, sizeof s, ", reward %.3f", r.is_number() ? r.get<double>() : 0.0);
  return s;
}

int grpo_command(const std::vector<std::string>& argv) {
  return run_preference_command<OnlineRun>("grpo", argv, online_options("grpo"),
                                           apply_online_embedded_defaults, make_grpo_run, "prompts",
                                           reward_summary);
}

int rloo_command(const std::vector<std::string>& argv) {
  return run_preference_command<OnlineRun>("rloo", argv, online_options("rloo"),
                                           apply_online_embedded_defaults, make_rloo_run, "prompts",
                                           reward_summary);
}

int online_dpo_command(const std::vector<std::string>& argv) {
  return run_preference_command<OnlineRun>("online_dpo", argv, online_options("online_dpo"),
                                           apply_online_embedded_defaults, make_online_dpo_run,
                                           "prompts", [](const nlohmann::json& last) {
                                             char s[96];
                                             std::snprintf(s, sizeof s, ", rewards/accuracies %.3f",
                                                           last.value("rewards/accuracies", 0.0));
                                             return std::string(s);
                                           });
}

const CommandRegistration kGrpo(
    "grpo",
    "group relative policy optimisation on in-process generations (TRL GRPOTrainer options); "
    "no options: the built-in demo task",
    grpo_command);
const CommandRegistration kRloo(
    "rloo", "REINFORCE leave-one-out on in-process generations (TRL RLOOTrainer options)",
    rloo_command);
const CommandRegistration kOnlineDpo(
    "online_dpo",
    "online DPO: two completions per prompt judged by the reward sources (TRL OnlineDPOTrainer "
    "options)",
    online_dpo_command);

}  // namespace
}  // namespace leantune
