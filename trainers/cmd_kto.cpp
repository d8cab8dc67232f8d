// trainer_bin kto: Kahneman-Tversky optimisation on unpaired preference data (TRL KTOTrainer
// options). With no model and no dataset: the built-in demo model on the built-in unpaired set
// (data/embedded/unpaired.jsonl).
#include <cstdio>

#include "trainers/commands.h"
#include "trainers/kto.h"
#include "trainers/preference_command.h"

namespace leantune {
namespace {

int kto_command(const std::vector<std::string>& argv) {
  return run_preference_command<KtoRun>(
      "kto", argv, kto_options(), apply_kto_embedded_defaults, make_kto_run, "examples",
      [](const nlohmann::json& last) {
        char s[96];
        std::snprintf(s, sizeof s, ", rewards/margins %.4f, kl %.4f",
                      last.value("rewards/margins", 0.0), last.value("kl", 0.0));
        return std::string(s);
      });
}

const CommandRegistration kKto(
    "kto",
    "Kahneman-Tversky optimisation on unpaired preferences (TRL KTOTrainer options); no "
    "options: the built-in demo",
    kto_command);

}  // namespace
}  // namespace leantune
