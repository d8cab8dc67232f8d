// The options several of trainer_bin's tools declare alike, one table each, so their names,
// defaults and help cannot drift apart between tools:
//   device_table      --device (generate, score)
//   overwrite_table   --overwrite (init-model, consolidate; declared by output_path.h)
//   data_tool_table   --dataset, --tokenizer and the chat options (pack, lengths), the data a
//                     tool tokenizes as sft would
// A tool's own table takes them with `base` (the tool's arguments struct derives from these).
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "loaders/option_table.h"
#include "trainers/common/data_options.h"

namespace leantune {

class TextEncoder;

struct DeviceArguments {
  std::string device = "auto";
};
const OptionTable<DeviceArguments>& device_table();

struct DataToolArguments : ChatArguments {
  std::string dataset;    // JSONL in a TRL format
  std::string tokenizer;  // empty: the dataset holds token ids
};
const OptionTable<DataToolArguments>& data_tool_table();

// A tool's options declared by its table into `o` and parsed into `a`: false when --help was
// printed (the tool then returns 0). `o` stays readable (positional arguments, is_set).
template <class S>
bool parse_tool_options(const OptionTable<S>& table, Options& o,
                        const std::vector<std::string>& args, S& a) {
  table.declare(o);
  if (!o.parse(args)) {
    std::printf("%s", o.help().c_str());
    return false;
  }
  a = table.read(o);
  return true;
}

// The text encoder of --tokenizer (a tokenizer folder, with a's chat options), or null when it
// is empty (the dataset then holds token ids).
std::unique_ptr<TextEncoder> tokenizer_option_encoder(const DataToolArguments& a);

}  // namespace leantune
