// trainer_bin kto: Kahneman-Tversky optimisation on unpaired preference data (TRL KTOTrainer
// options). With no model and no dataset: the built-in demo model on the built-in unpaired set
// (data/embedded/unpaired.jsonl).
#include <cstdio>

#include "trainers/commands.h"
#include "trainers/kto.h"

namespace leantune {
namespace {

int kto_command(const std::vector<std::string>& argv) {
  StopSignalScope signals;
  Options o = kto_options();
  if (!o.parse(argv)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  apply_kto_embedded_defaults(o);
  KtoRun run = make_kto_run(o);
  const std::string path = o.get_string("model_name_or_path");
  std::printf("kto: %s (%lld parameters) on %s, %lld examples\n",
              path.empty() ? "built-in demo model" : path.c_str(),
              static_cast<long long>(run.model.model->num_parameters()),
              run.model.model->device().str().c_str(),
              static_cast<long long>(run.trainer->train_stats().examples));
  std::fflush(stdout);
  if (stop_requested()) {
    std::printf("kto: stopped by a signal before training began; nothing to save\n");
    return 0;
  }
  const TrainResult r = run.trainer->train();
  if (r.nothing_to_do) {
    std::printf("kto: nothing to do: %s is at step %lld and this run has %lld steps\n",
                r.resumed_from.c_str(), static_cast<long long>(r.steps),
                static_cast<long long>(r.total_steps));
    return 0;
  }
  if (r.interrupted) {
    std::printf("kto: stopped at step %lld; resume with --resume_from_checkpoint latest\n",
                static_cast<long long>(r.steps));
    return 0;
  }
  const auto& logged = run.trainer->logged_metrics();
  std::printf("kto: %lld steps, loss %.4f -> %.4f", static_cast<long long>(r.steps),
              r.losses.empty() ? 0.0 : r.losses.front(), r.losses.empty() ? 0.0 : r.losses.back());
  if (!logged.empty())
    std::printf(", rewards/margins %.4f, kl %.4f", logged.back().value("rewards/margins", 0.0),
                logged.back().value("kl", 0.0));
  std::printf("; model written to %s\n", run.trainer->args().output_dir.c_str());
  std::printf("%s", format_memory_report(r.memory).c_str());
  return 0;
}

const CommandRegistration kKto(
    "kto",
    "Kahneman-Tversky optimisation on unpaired preferences (TRL KTOTrainer options); no "
    "options: the built-in demo",
    kto_command);

}  // namespace
}  // namespace leantune
