// The two options every trainer declares first: the model it trains and its training data. Each
// trainer gives them its own help (what data format it reads); the names live here once, and
// the code that serves every trainer (the model loader, the demo defaults, the check that a
// dataset comes with a model) reads them through model_source().
//   model_name_or_path  HF model folder (or PEFT adapter folder); empty with no dataset: the
//                       built-in demo model
//   dataset             JSONL training data; empty: the demo's data (only with the demo model)
#pragma once

#include <string>

#include "loaders/option_table.h"

namespace leantune {

struct ModelSource {
  std::string model_name_or_path;
  std::string dataset;
};

// A trainer's model and dataset options with its help texts (kept by the trainer's table).
OptionTable<ModelSource> model_source_table(std::string model_help, std::string dataset_help);
// The two values from any trainer's options.
ModelSource model_source(const Options& o);

}  // namespace leantune
