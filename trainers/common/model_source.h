// The two options every trainer declares first: the model it trains and its training data. Each
// trainer gives them its own help (what data format it reads); the names live here once, and
// the code that serves every trainer (the model loader, the demo defaults, the check that a
// dataset comes with a model) reads them through model_source().
//   model_name_or_path  HF model folder (or PEFT adapter folder), or a Hub ID found in the local
//                       Hugging Face cache (loaders/hub_cache.h); empty with no dataset: the
//                       built-in demo model
//   model_revision      the branch, tag or commit of a Hub ID (TRL's ModelConfig name)
//   dataset             JSONL training data; empty: the demo's data (only with the demo model)
//   eval_dataset        evaluation data in the same format (trainers/common/evaluation.h)
//   dataset_train_split / dataset_test_split: the splits a dataset folder's files are named by
//                       (TRL's ScriptArguments): a folder stands for its train split's file,
//                       and, under an eval_strategy, its test split is the evaluation data
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "loaders/option_table.h"

namespace leantune {

struct ModelSource {
  std::string model_name_or_path;       // a folder, or a Hub ID in the local cache (hub_cache.h)
  std::string model_revision = "main";  // of a Hub ID: a branch, tag or commit
  std::string dataset;
  std::string eval_dataset;  // "": no evaluation
  std::string dataset_train_split = "train";
  std::string dataset_test_split = "test";
};

// The sequence options of the trainers that score prompt + completion with a reference model
// (dpo, kto): TRL's max_length (1024) and truncation_mode, and leantune's use_liger_loss.
struct ScoredSequences {
  std::optional<int64_t> max_length = 1024;  // none: no limit
  std::string truncation_mode = "keep_start";
  bool use_liger_loss = true;  // the chunked LM head: no [tokens x vocab] logits
};
const OptionTable<ScoredSequences>& scored_sequences_table();

// A trainer's model and dataset options with its help texts (kept by the trainer's table).
OptionTable<ModelSource> model_source_table(std::string model_help, std::string dataset_help);
// The values from any trainer's options.
ModelSource model_source(const Options& o);
// The folder model_name_or_path means (a Hub ID resolved in the cache; "" for the demo).
std::string model_folder(const ModelSource& s);

// The JSONL file of `split` in a dataset given as a file or a folder (`option` names it in
// errors), as datasets' load_dataset finds a local folder's splits: <split>.jsonl,
// <split>-*.jsonl, data/<split>.jsonl or data/<split>-*.jsonl; a folder holding a single .jsonl
// file has it as its train split. A file (or a path that does not exist: its reader names it)
// is itself. Error(kInput) naming the folder for no match or several shards (leantune reads
// one file per split), listing the .jsonl files it holds. `required` false: "" when the folder
// has no such split.
std::string dataset_split_file(const std::string& path, const std::string& split,
                               const char* option, bool required = true);
// The training data's file (dataset, its train split for a folder).
std::string train_data_path(const ModelSource& s);
// The evaluation data's file: eval_dataset (a folder: its test split), else, under an
// eval_strategy other than no, the test split of a dataset folder that has one (TRL's scripts
// evaluate dataset[dataset_test_split]); "" for none.
std::string eval_data_path(const ModelSource& s, const std::string& eval_strategy);

// Error(kInput) when the tokenizer in tokenizer_dir has more tokens than the model's vocab_size:
// names both files (tokenizer.json and model_dir's config.json) and the fix (the tokenizer
// belongs to another model).
void check_tokenizer_fits(int64_t tokenizer_vocab, const std::string& tokenizer_dir,
                          int64_t model_vocab, const std::string& model_dir);

}  // namespace leantune
