// trainer_bin dpo: direct preference optimisation (TRL DPOTrainer options). With no model and
// no dataset: the built-in demo model on the built-in preference set (data/embedded).
#include <cstdio>

#include "trainers/commands.h"
#include "trainers/dpo.h"

namespace leantune {
namespace {

int dpo_command(const std::vector<std::string>& argv) {
  StopSignalScope signals;
  Options o = dpo_options();
  if (!o.parse(argv)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  apply_dpo_embedded_defaults(o);
  DpoRun run = make_dpo_run(o);
  const std::string path = o.get_string("model_name_or_path");
  std::printf("dpo: %s (%lld parameters) on %s, %lld pairs\n",
              path.empty() ? "built-in demo model" : path.c_str(),
              static_cast<long long>(run.model.model->num_parameters()),
              run.model.model->device().str().c_str(),
              static_cast<long long>(run.trainer->train_stats().examples));
  std::fflush(stdout);
  if (stop_requested()) {
    std::printf("dpo: stopped by a signal before training began; nothing to save\n");
    return 0;
  }
  const TrainResult r = run.trainer->train();
  if (r.nothing_to_do) {
    std::printf("dpo: nothing to do: %s is at step %lld and this run has %lld steps\n",
                r.resumed_from.c_str(), static_cast<long long>(r.steps),
                static_cast<long long>(r.total_steps));
    return 0;
  }
  if (r.interrupted) {
    std::printf("dpo: stopped at step %lld; resume with --resume_from_checkpoint latest\n",
                static_cast<long long>(r.steps));
    return 0;
  }
  const auto& logged = run.trainer->logged_metrics();
  std::printf("dpo: %lld steps, loss %.4f -> %.4f", static_cast<long long>(r.steps),
              r.losses.empty() ? 0.0 : r.losses.front(), r.losses.empty() ? 0.0 : r.losses.back());
  if (!logged.empty())
    std::printf(", rewards/accuracies %.3f, rewards/margins %.4f",
                logged.back().value("rewards/accuracies", 0.0),
                logged.back().value("rewards/margins", 0.0));
  std::printf("; model written to %s\n", run.trainer->args().output_dir.c_str());
  std::printf("%s", format_memory_report(r.memory).c_str());
  return 0;
}

const CommandRegistration kDpo(
    "dpo", "direct preference optimisation (TRL DPOTrainer options); no options: the built-in demo",
    dpo_command);

}  // namespace
}  // namespace leantune
