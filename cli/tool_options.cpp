// One declaration of the options trainer_bin's tools share (see tool_options.h).
#include "cli/tool_options.h"

#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "trainers/common/output_path.h"

namespace leantune {

const OptionTable<DeviceArguments>& device_table() {
  static const OptionTable<DeviceArguments> t = OptionTable<DeviceArguments>().text(
      "device", &DeviceArguments::device, "cpu, cuda, cuda:N or auto");
  return t;
}

const OptionTable<DataToolArguments>& data_tool_table() {
  using D = DataToolArguments;
  static const OptionTable<D> t =
      OptionTable<D>()
          .text("dataset", &D::dataset, "JSONL dataset in a TRL format")
          .text("tokenizer", &D::tokenizer, "tokenizer folder (not needed for a tokenized dataset)")
          .base(chat_table());
  return t;
}

std::unique_ptr<TextEncoder> tokenizer_option_encoder(const DataToolArguments& a) {
  if (a.tokenizer.empty()) return nullptr;
  std::shared_ptr<Tokenizer> tok = Tokenizer::load(a.tokenizer);
  apply_chat_options(a, *tok);
  return make_text_encoder(tok);
}

}  // namespace leantune
