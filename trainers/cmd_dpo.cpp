// trainer_bin dpo: direct preference optimisation (TRL DPOTrainer options). With no model and
// no dataset: the built-in demo model on the built-in preference set (data/embedded).
#include <cstdio>

#include "trainers/commands.h"
#include "trainers/dpo.h"
#include "trainers/preference_command.h"

namespace leantune {
namespace {

int dpo_command(const std::vector<std::string>& argv) {
  return run_preference_command<DpoRun>(
      "dpo", argv, dpo_options(), apply_dpo_embedded_defaults, make_dpo_run, "pairs",
      [](const nlohmann::json& last) {
        char s[96];
        std::snprintf(s, sizeof s, ", rewards/accuracies %.3f, rewards/margins %.4f",
                      last.value("rewards/accuracies", 0.0), last.value("rewards/margins", 0.0));
        return std::string(s);
      });
}

const CommandRegistration kDpo(
    "dpo", "direct preference optimisation (TRL DPOTrainer options); no options: the built-in demo",
    dpo_command);

}  // namespace
}  // namespace leantune
