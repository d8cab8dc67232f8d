// One declaration of the chat and dataset option groups (see data_options.h).
#include "trainers/common/data_options.h"

#include <filesystem>

#include "loaders/chat_template.h"
#include "loaders/tokenizer.h"

namespace leantune {

const OptionTable<ChatArguments>& chat_table() {
  using C = ChatArguments;
  static const OptionTable<C> t = [] {
    std::string names;
    for (const std::string& n : ChatTemplate::bundled_names())
      names += (names.empty() ? "" : ", ") + n;
    return OptionTable<C>()
        .text("chat_template", &C::chat_template,
              "chat template instead of the tokenizer's: " + names + ", or a .jinja file")
        .text("chat_template_kwargs", &C::chat_template_kwargs,
              "JSON object of extra chat template variables (e.g. {\"enable_thinking\": false})");
  }();
  return t;
}

void add_chat_options(Options& o) { chat_table().declare(o); }

void apply_chat_options(const ChatArguments& c, Tokenizer& tok) {
  if (!c.chat_template.empty()) tok.set_chat_template(c.chat_template);
  if (!c.chat_template_kwargs.empty())
    tok.set_chat_template_kwargs(parse_chat_template_kwargs(c.chat_template_kwargs));
}

CommandInput chat_template_input(const ChatArguments& c) {
  const std::string& t = c.chat_template;
  std::error_code ec;
  return {std::filesystem::is_regular_file(t, ec) ? t : std::string(), "--chat_template"};
}

const OptionTable<DataConfig>& row_dataset_table() {
  static const OptionTable<DataConfig> t = OptionTable<DataConfig>().flag(
      "skip_bad_lines", &DataConfig::skip_bad_lines,
      "skip (and count) malformed dataset lines instead of stopping");
  return t;
}

const OptionTable<DataConfig>& packing_table() {
  using D = DataConfig;
  static const OptionTable<D> t =
      OptionTable<D>()
          .text("packing_strategy", &D::packing_strategy, "how examples are packed",
                {"bfd", "bfd_split", "wrapped"})
          .integer("packing_window", &D::packing_window,
                   "examples packed together (0 = the whole dataset; 1000 = TRL's chunks)", 0);
  return t;
}

const OptionTable<DataConfig>& dataset_table() {
  using D = DataConfig;
  static const OptionTable<D> t =
      OptionTable<D>()
          .text("dataset_text_field", &D::dataset_text_field,
                "the text key of language-modeling data")
          .flag_or_none("completion_only_loss", &D::completion_only_loss,
                        "loss only on completion tokens (default: on for prompt-completion data)")
          .flag("assistant_only_loss", &D::assistant_only_loss,
                "loss only on the assistant's tokens (chat data)")
          .include(row_dataset_table());
  return t;
}

void add_dataset_options(Options& o) { dataset_table().declare(o); }

void read_dataset_options(const Options& o, DataConfig* cfg) { dataset_table().read_into(o, *cfg); }

}  // namespace leantune
