// trainer_bin reward: reward modelling on preference pairs (TRL RewardTrainer options). With no
// model and no dataset: the built-in demo model, given a score head, on the built-in preference
// set (data/embedded/preferences.jsonl).
#include <cstdio>

#include "trainers/commands.h"
#include "trainers/reward.h"
#include "trainers/sft.h"
#include "trainers/startup.h"

namespace leantune {
namespace {

int reward_command(const std::vector<std::string>& argv) {
  StopSignalScope signals;
  Options o = reward_options();
  if (!o.parse(argv)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  apply_reward_embedded_defaults(o);
  RewardRun run = make_reward_run(o);
  const std::string path = o.get_string("model_name_or_path");
  std::printf("reward: %s as %s%s (%lld parameters) on %s, %lld pairs\n",
              path.empty() ? "built-in demo model" : path.c_str(),
              run.model.model->config().architecture.c_str(),
              run.model.converted ? " (new score head)" : "",
              static_cast<long long>(run.model.model->num_parameters()),
              run.model.model->device().str().c_str(),
              static_cast<long long>(run.trainer->train_stats().examples));
  print_blas_header(run.model.model->device().is_cpu());
  std::fflush(stdout);
  if (stop_requested()) {
    std::printf("reward: stopped by a signal before training began; nothing to save\n");
    return 0;
  }
  const TrainResult r = run.trainer->train();
  if (r.nothing_to_do) {
    std::printf("reward: nothing to do: %s is at step %lld and this run has %lld steps\n",
                r.resumed_from.c_str(), static_cast<long long>(r.steps),
                static_cast<long long>(r.total_steps));
    return 0;
  }
  if (r.interrupted) {
    std::printf("%s\n", stopped_line("reward", r.steps).c_str());
    return 0;
  }
  const auto& logged = run.trainer->logged_metrics();
  std::printf("reward: %lld steps, loss %.4f -> %.4f", static_cast<long long>(r.steps),
              r.losses.empty() ? 0.0 : r.losses.front(), r.losses.empty() ? 0.0 : r.losses.back());
  if (!logged.empty())
    std::printf(", accuracy %.3f, margin %.4f", logged.back().value("accuracy", 0.0),
                logged.back().value("margin", 0.0));
  std::printf("; model written to %s\n", run.trainer->args().output_dir.c_str());
  std::printf("%s", format_memory_report(r.memory).c_str());
  return 0;
}

const CommandRegistration kReward(
    "reward",
    "reward modelling on preference pairs (TRL RewardTrainer options); no options: the built-in "
    "demo",
    reward_command);

}  // namespace
}  // namespace leantune
