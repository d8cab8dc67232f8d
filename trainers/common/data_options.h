// The data options sft, pack, lengths, tokenize and generate share, declared once here so their
// names, help and accepted values cannot drift apart:
//   chat group:    --chat_template NAME|FILE.jinja (a bundled template name or a template file
//                  instead of the tokenizer's), --chat_template_kwargs JSON (extra template
//                  variables, TRL's chat_template_kwargs, e.g. '{"enable_thinking": false}')
//   dataset group: --dataset_text_field, --completion_only_loss, --assistant_only_loss,
//                  --skip_bad_lines (TRL's names and defaults); the trainers that read whole
//                  rows (dpo, kto, reward) declare --skip_bad_lines alone
//                  (row_dataset_table)
#pragma once

#include <string>

#include "loaders/data_config.h"
#include "loaders/option_table.h"
#include "trainers/common/output_path.h"

namespace leantune {

class Tokenizer;

struct ChatArguments {
  std::string chat_template;         // a bundled name or a .jinja file; empty: the tokenizer's
  std::string chat_template_kwargs;  // a JSON object
};

const OptionTable<ChatArguments>& chat_table();
void add_chat_options(Options& o);
// Applies --chat_template / --chat_template_kwargs to the tokenizer's chat template (Error
// kInput for an unknown name, an unreadable file, bad JSON, or kwargs without a template).
void apply_chat_options(const ChatArguments& c, Tokenizer& tok);
// --chat_template as an input of the command (output_path.h), when it names a file.
CommandInput chat_template_input(const ChatArguments& c);

// packing_strategy and packing_window of DataConfig: sft's and pack's.
const OptionTable<DataConfig>& packing_table();
// skip_bad_lines of DataConfig: the dataset option of the trainers that read whole rows (dpo,
// kto, reward), whose losses take no loss-mask options.
const OptionTable<DataConfig>& row_dataset_table();
// dataset_text_field, completion_only_loss, assistant_only_loss, then row_dataset_table's: sft's
// and the data tools'.
const OptionTable<DataConfig>& dataset_table();
void add_dataset_options(Options& o);
void read_dataset_options(const Options& o, DataConfig* cfg);

}  // namespace leantune
