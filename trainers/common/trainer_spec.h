// One TrainerSpec per training algorithm: what the command line, the estimate and the demo need
// to know about it, declared once beside the algorithm (trainers/<algorithm>/) and listed once in
// trainers/registry.cpp. trainer_bin builds its list of trainer commands from trainer_specs(),
// runs each through one driver (cli/cmd_train.cpp), fills in the built-in demo's settings with
// apply_demo_defaults and dispatches `trainer_bin estimate <algorithm>` to the spec's estimate.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loaders/options.h"
#include "models/decoder.h"
#include "trainers/common/trainer.h"
#include "trainers/sft/sft.h"

namespace leantune {

// A run built from options: the model it trains and its trainer (train(), the data report, the
// logged metrics, the memory report).
struct TrainRun {
  std::shared_ptr<DecoderModel> model;
  std::unique_ptr<Trainer> trainer;
  // After the model's path in the command's first line (reward: " as <architecture> (new score
  // head)"); empty for most.
  std::string model_note;
  // Set for a built-in demo whose command ends with a line of its own (sft: "sample: " and a
  // continuation of a story opening by the trained model).
  std::function<std::string()> demo_sample;
};

// An algorithm's run struct (a `model` SftModel and a `trainer`) as a TrainRun.
template <typename Run>
TrainRun train_run(Run r, std::string model_note = "") {
  return TrainRun{r.model.model, std::move(r.trainer), std::move(model_note), {}};
}

struct TrainerSpec {
  std::string name;           // the command: trainer_bin <name>
  std::string summary;        // its line in trainer_bin --help
  std::string examples_word;  // what the data report counts: "pairs", "examples", "prompts"
  // The command's options (`command` names the usage line: estimate reuses them).
  std::function<Options(const std::string& command)> options;
  // The built-in demo (no --model_name_or_path and no --dataset): the settings it takes for
  // options the user did not set; output_dir defaults to trainer_output/embedded_<name>.
  std::vector<std::pair<std::string, nlohmann::json>> demo_defaults;
  // Refuses bad options, loads the model and the data, builds the trainer (Error kInput, one
  // line, for any bad option, file or row).
  std::function<TrainRun(const Options&)> make_run;
  // The same on a model already loaded from the same model options (sft_model_option_names),
  // with an embedder's communicator and in-memory rows, as the public API's Trainer runs it; empty
  // where the algorithm loads a model of its own kind
  // (reward: a sequence classifier).
  std::function<TrainRun(const Options&, SftModel, const RunInputs&)> make_run_on_model;
  // The last logged metrics the command's last line ends with, each with its decimals
  // (", rewards/margins 0.1234"); a metric that is not a number prints as 0.
  std::vector<std::pair<std::string, int>> summary_metrics;
  // trainer_bin estimate <name> ARGS (empty: estimate's own sft front-end).
  std::function<int(const std::vector<std::string>& args)> estimate;
  // Whether its trainer splits sequences over --cp_size ranks (supports_context_parallel()).
  bool context_parallel = false;
};

// Every algorithm, in the order trainer_bin --help lists them.
const std::vector<const TrainerSpec*>& trainer_specs();
// The spec named `name`, or nullptr.
const TrainerSpec* find_trainer_spec(const std::string& name);

// The demo's settings for the options the user did not set, when neither model_name_or_path nor
// dataset is given.
void apply_demo_defaults(const TrainerSpec& spec, Options& o);

// The preference trainers' demo (dpo, kto, reward): 128 tokens, 8 rows a micro-batch, 40 updates
// at a constant 1e-3, logged every 5, no checkpoints, output_dir trainer_output/embedded_<name>.
std::vector<std::pair<std::string, nlohmann::json>> small_demo_defaults(const std::string& name);

// "sft, dpo and kto": the algorithms whose spec says context_parallel, for messages.
std::string context_parallel_trainer_names();

// ", name value, ..." of the spec's summary_metrics in `last` (the command's last line).
std::string summary_line(const TrainerSpec& spec, const nlohmann::json& last);

// Refuses --dataset without --model_name_or_path (the demo's data fits the demo's model only).
void check_model_for_dataset(const std::string& command, const Options& o);

}  // namespace leantune
