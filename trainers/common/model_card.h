// The README.md model card a run writes beside its final model, as TRL writes one: YAML front
// matter (base_model, library_name, model_name, tags) and a short text naming the base model, the
// trainer, the dataset, the hyper-parameters that shape the run and the last logged metrics, so
// that a folder carried to the Hub or another team says how it was made.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace leantune {

struct ModelCardInfo {
  std::string model_name;  // the output folder's name
  std::string base_model;  // a Hub ID, a local path, or empty for the built-in demo model
  std::string trainer;     // the command: sft, dpo, ...
  std::string dataset;     // the training data as given (empty: the demo's)
  bool adapter = false;    // a PEFT adapter rather than a whole model
  std::vector<std::pair<std::string, std::string>> hyperparameters;  // name, value as written
  nlohmann::json metrics;  // the last logged record (numbers only are listed)
  int64_t steps = 0;
};

std::string model_card(const ModelCardInfo& info);

}  // namespace leantune
