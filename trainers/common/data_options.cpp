// One declaration of the chat and dataset option groups (see data_options.h).
#include "trainers/common/data_options.h"

#include <filesystem>

#include "loaders/chat_template.h"
#include "loaders/tokenizer.h"

namespace leantune {

void add_chat_options(Options& o) {
  std::string names;
  for (const std::string& n : ChatTemplate::bundled_names())
    names += (names.empty() ? "" : ", ") + n;
  o.add_string("chat_template", "",
               "chat template instead of the tokenizer's: " + names + ", or a .jinja file");
  o.add_string("chat_template_kwargs", "",
               "JSON object of extra chat template variables (e.g. {\"enable_thinking\": false})");
}

void apply_chat_options(const Options& o, Tokenizer& tok) {
  if (!o.get_string("chat_template").empty()) tok.set_chat_template(o.get_string("chat_template"));
  if (!o.get_string("chat_template_kwargs").empty()) {
    tok.set_chat_template_kwargs(parse_chat_template_kwargs(o.get_string("chat_template_kwargs")));
  }
}

CommandInput chat_template_input(const Options& o) {
  const std::string& t = o.get_string("chat_template");
  std::error_code ec;
  return {std::filesystem::is_regular_file(t, ec) ? t : std::string(), "--chat_template"};
}

void add_dataset_options(Options& o) {
  o.add_string("dataset_text_field", "text", "the text key of language-modeling data");
  o.add_bool_or_none("completion_only_loss", std::nullopt,
                     "loss only on completion tokens (default: on for prompt-completion data)");
  o.add_bool("assistant_only_loss", false, "loss only on the assistant's tokens (chat data)");
  o.add_bool("skip_bad_lines", false,
             "skip (and count) malformed dataset lines instead of stopping");
}

void read_dataset_options(const Options& o, DataConfig* cfg) {
  cfg->dataset_text_field = o.get_string("dataset_text_field");
  cfg->completion_only_loss = o.get_bool_or_none("completion_only_loss");
  cfg->assistant_only_loss = o.get_bool("assistant_only_loss");
  cfg->skip_bad_lines = o.get_bool("skip_bad_lines");
}

}  // namespace leantune
