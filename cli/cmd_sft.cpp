// trainer_bin sft, built on the public API (include/leantune/leantune.h): the command line is
// parsed into sft's options (loaders/options.h), the model options go to Model::load, the rest
// to a Trainer config, and the run, its report and the demo's sample come from the API. An
// api::Error goes back to trainer_bin's main as the leantune::Error of the same kind (same
// message, same exit code).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/startup.h"
#include "engine/check.h"
#include "leantune/leantune.h"
#include "trainers/common/trainer.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

ErrorKind kind_of(api::ErrorCategory c) {
  switch (c) {
    case api::ErrorCategory::kInput:
      return ErrorKind::kInput;
    case api::ErrorCategory::kOutOfMemory:
      return ErrorKind::kOutOfMemory;
    case api::ErrorCategory::kNonFinite:
      return ErrorKind::kNonFinite;
    case api::ErrorCategory::kComm:
      return ErrorKind::kComm;
    case api::ErrorCategory::kInternal:
      break;
  }
  return ErrorKind::kInternal;
}

int run_sft(const Options& o) {
  check_model_for_dataset("sft", o);
  // The options the user set, split between the model and the trainer; seed serves both (the
  // model's random init and LoRA init, the data order).
  const nlohmann::json all = o.to_json();
  nlohmann::json model_json = nlohmann::json::object(), config = nlohmann::json::object();
  for (auto it = all.begin(); it != all.end(); ++it) {
    if (!o.is_set(it.key()) || it.key() == "model_name_or_path") continue;
    bool model_key = false;
    for (const std::string& n : sft_model_option_names()) model_key = model_key || n == it.key();
    (model_key ? model_json : config)[it.key()] = it.value();
  }
  // Option combinations are refused before anything loads.
  const TrainingArguments args = training_arguments(o);
  api::ModelOptions mo;
  mo.seed = args.seed;
  mo.json = model_json.dump();
  const ModelSource src = model_source(o);
  const std::string& path = src.model_name_or_path;
  api::Model model = api::Model::load(path, mo);
  api::Trainer trainer(model, config.dump());
  std::printf("sft: %s (%s, %lld parameters) on %s, %s\n",
              path.empty() ? "built-in demo model" : path.c_str(), model.architecture().c_str(),
              static_cast<long long>(model.num_parameters()), model.device().c_str(),
              model.dtype().c_str());
  print_blas_header(model.device() == "cpu");
  std::fflush(stdout);
  if (stop_requested()) {
    std::printf("sft: stopped by a signal before training began; nothing to save\n");
    return 0;
  }
  const api::TrainSummary r = trainer.train();
  if (r.nothing_to_do) {
    std::printf(
        "sft: nothing to do: %s is at step %lld and this run has %lld steps (raise --max_steps "
        "to train further); no model written\n",
        r.resumed_from.c_str(), static_cast<long long>(r.steps),
        static_cast<long long>(r.total_steps));
    return 0;
  }
  if (r.stopped_early) {
    std::printf("%s\n", stopped_line("sft", r.steps).c_str());
    return 0;
  }
  const std::string skipped =
      r.skipped_steps ? ", " + std::to_string(r.skipped_steps) + " updates skipped" : "";
  std::printf("sft: %lld steps, loss %.4f -> %.4f%s; model written to %s\n",
              static_cast<long long>(r.steps), r.losses.empty() ? 0.0 : r.losses.front(),
              r.losses.empty() ? 0.0 : r.losses.back(), skipped.c_str(),
              trainer.output_dir().c_str());
  std::printf("%s", r.memory_report.c_str());
  if (path.empty() && src.dataset.empty()) {
    const std::string prompt = "One sunny day, Mia";
    api::GenerateOptions g;
    g.max_new_tokens = 48;
    std::printf("sample: %s%s\n", prompt.c_str(), model.generate(prompt, g).c_str());
  }
  return 0;
}

int sft_command(const std::vector<std::string>& argv) {
  // From the start: a SIGTERM while the data loads is a clean stop, as during training.
  StopSignalScope signals;
  Options o = sft_options();
  if (!o.parse(argv)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  try {
    return run_sft(o);
  } catch (const api::Error& e) {
    throw Error(kind_of(e.category()), e.what());
  }
}

}  // namespace

int cmd_sft(const std::vector<std::string>& args) { return sft_command(args); }

}  // namespace leantune
