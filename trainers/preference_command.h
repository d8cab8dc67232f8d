// The command-line driver shared by the preference and online trainers (trainer_bin dpo, kto, grpo,
// rloo, online_dpo): parse the options, fill in the built-in demo's settings, build the run, train,
// and print the outcome (nothing to do, stopped, or the loss and the trainer's last logged metrics)
// and the memory report. Run is the trainer's run struct (a `model` SftModel and a `trainer` with
// train(), train_stats(), logged_metrics() and args()).
#pragma once

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainers/sft.h"
#include "trainers/startup.h"
#include "trainers/trainer.h"

namespace leantune {

template <typename Run>
int run_preference_command(const std::string& name, const std::vector<std::string>& argv,
                           Options o, void (*apply_demo_defaults)(Options&),
                           Run (*make_run)(const Options&), const char* examples_word,
                           const std::function<std::string(const nlohmann::json&)>& summary) {
  StopSignalScope signals;
  if (!o.parse(argv)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  apply_demo_defaults(o);
  Run run = make_run(o);
  const std::string path = o.get_string("model_name_or_path");
  std::printf("%s: %s (%lld parameters) on %s, %lld %s\n", name.c_str(),
              path.empty() ? "built-in demo model" : path.c_str(),
              static_cast<long long>(run.model.model->num_parameters()),
              run.model.model->device().str().c_str(),
              static_cast<long long>(run.trainer->train_stats().examples), examples_word);
  print_blas_header(run.model.model->device().is_cpu());
  std::fflush(stdout);
  if (stop_requested()) {
    std::printf("%s: stopped by a signal before training began; nothing to save\n", name.c_str());
    return 0;
  }
  const TrainResult r = run.trainer->train();
  if (r.nothing_to_do) {
    std::printf("%s: nothing to do: %s is at step %lld and this run has %lld steps\n",
                name.c_str(), r.resumed_from.c_str(), static_cast<long long>(r.steps),
                static_cast<long long>(r.total_steps));
    return 0;
  }
  if (r.interrupted) {
    std::printf("%s\n", stopped_line(name, r.steps).c_str());
    return 0;
  }
  const auto& logged = run.trainer->logged_metrics();
  std::printf("%s: %lld steps, loss %.4f -> %.4f%s; model written to %s\n", name.c_str(),
              static_cast<long long>(r.steps), r.losses.empty() ? 0.0 : r.losses.front(),
              r.losses.empty() ? 0.0 : r.losses.back(),
              logged.empty() ? "" : summary(logged.back()).c_str(),
              run.trainer->args().output_dir.c_str());
  std::printf("%s", format_memory_report(r.memory).c_str());
  return 0;
}

}  // namespace leantune
