// trainer_bin <algorithm> for every algorithm: parse the spec's options, fill in the built-in
// demo's settings, build the run, train, and print the outcome (nothing to do, stopped, or the
// loss and the algorithm's last logged metrics), the memory report and a demo's closing line.
#include <cstdio>

#include "cli/commands.h"
#include "cli/startup.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/sft/sft.h"

namespace leantune {

int run_trainer_command(const TrainerSpec& spec, const std::vector<std::string>& argv) {
  // From the start: a SIGTERM while the data loads is a clean stop, as during training.
  StopSignalScope signals;
  Options o = spec.options(spec.name);
  if (!o.parse(argv)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  apply_demo_defaults(spec, o);
  TrainRun run = spec.make_run(o);
  const char* name = spec.name.c_str();
  const std::string path = model_source(o).model_name_or_path;
  std::printf(
      "%s: %s%s (%lld parameters) on %s, %lld %s\n", name,
      path.empty() ? "built-in demo model" : path.c_str(), run.model_note.c_str(),
      static_cast<long long>(run.model->num_parameters()), run.model->device().str().c_str(),
      static_cast<long long>(run.trainer->train_stats().examples), spec.examples_word.c_str());
  print_blas_header(run.model->device().is_cpu());
  std::fflush(stdout);
  if (stop_requested()) {
    std::printf("%s: stopped by a signal before training began; nothing to save\n", name);
    return 0;
  }
  const TrainResult r = run.trainer->train();
  if (r.nothing_to_do) {
    std::printf(
        "%s: nothing to do: %s is at step %lld and this run has %lld steps (raise --max_steps to "
        "train further); no model written\n",
        name, r.resumed_from.c_str(), static_cast<long long>(r.steps),
        static_cast<long long>(r.total_steps));
    return 0;
  }
  if (r.interrupted) {
    std::printf("%s\n", stopped_line(spec.name, r.steps).c_str());
    return 0;
  }
  const auto& logged = run.trainer->logged_metrics();
  std::printf("%s: %lld steps, loss %.4f -> %.4f%s; model written to %s\n", name,
              static_cast<long long>(r.steps), r.losses.empty() ? 0.0 : r.losses.front(),
              r.losses.empty() ? 0.0 : r.losses.back(),
              logged.empty() ? "" : summary_line(spec, logged.back()).c_str(),
              run.trainer->args().output_dir.c_str());
  std::printf("%s", format_memory_report(r.memory).c_str());
  if (run.demo_sample) std::printf("%s\n", run.demo_sample().c_str());
  return 0;
}

}  // namespace leantune
