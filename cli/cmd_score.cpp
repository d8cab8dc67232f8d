// trainer_bin score --model DIR --dataset F.jsonl [--output F]: the reward of every row of a
// JSONL dataset under a reward model (trainer_bin reward's output: an HF
// *ForSequenceClassification folder, or a PEFT adapter of one), one JSON line per kept row:
//   {"line": N, "reward": r}                                 text / messages / prompt+completion
//   {"line": N, "chosen_reward": r, "rejected_reward": r}    preference rows
// Rows are tokenized as the reward trainer tokenizes a pair's side (loaders/examples.h
// reward_sequence_ids: prompt + completion + eos text with special tokens, or the chat template
// over the messages); tokenized rows ({"input_ids"}) are scored as given. Sequences are scored in
// flat varlen batches of --batch_size rows (no padding; the score is read at each sequence's
// last non-pad token, models/score_head.h).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/tool_options.h"
#include "loaders/examples.h"
#include "loaders/fs_util.h"
#include "loaders/hub_cache.h"
#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "trainers/common/data_options.h"
#include "trainers/common/model_source.h"
#include "trainers/common/output_path.h"
#include "trainers/common/peft_options.h"
#include "trainers/reward/reward.h"

namespace leantune {
namespace {

struct PendingRow {
  int64_t line = 0;
  bool pair = false;
};

struct ScoreArguments : DeviceArguments, ChatArguments {
  std::string model;
  std::string dataset;
  std::string output;
  int64_t batch_size = 8;
  bool bf16 = false;
  DataConfig data;  // the dataset group (dataset_text_field, skip_bad_lines, ...)
};

const OptionTable<ScoreArguments>& score_table() {
  using S = ScoreArguments;
  static const OptionTable<S> t =
      OptionTable<S>()
          .text("model", &S::model,
                "a reward model folder (trainer_bin reward's output), or its adapter")
          .text("dataset", &S::dataset,
                "JSONL rows to score: text, messages, prompt+completion, preference pairs or "
                "input_ids")
          .text("output", &S::output, "JSONL file of rewards (empty: standard output)")
          .integer("batch_size", &S::batch_size, "rows scored per forward pass", 1)
          .base(device_table())
          .flag("bf16", &S::bf16, "bf16 weights and activations")
          .nested(&S::data, dataset_table())
          .base(chat_table());
  return t;
}

int score_command(const std::vector<std::string>& argv) {
  Options o("score");
  ScoreArguments a;
  if (!parse_tool_options(score_table(), o, argv, a)) return 0;
  const std::string path = resolve_model_path(a.model, "model");  // a Hub ID: its cached snapshot
  const std::string& dataset = a.dataset;
  LT_CHECK_INPUT(!path.empty(), "score: --model is required");
  LT_CHECK_INPUT(!dataset.empty(), "score: --dataset is required");
  const std::string& output = a.output;
  if (!output.empty())
    check_output_file(output, "output",
                      {{path, "--model"}, {dataset, "--dataset"}, chat_template_input(a)});
  std::string tokenizer_dir = path;
  if (is_adapter_dir(path) && !std::filesystem::exists(path + "/tokenizer.json"))
    tokenizer_dir = resolve_base_model_path(path);
  auto tokenizer = Tokenizer::load(tokenizer_dir);
  apply_chat_options(a, *tokenizer);
  const std::unique_ptr<TextEncoder> enc = make_text_encoder(tokenizer);
  const RewardModel rm = open_reward_model(
      path, Device::parse(a.device), a.bf16 ? DType::kBF16 : DType::kF32, enc->pad_token_id());
  check_tokenizer_fits(tokenizer->vocab_size(), tokenizer_dir, rm.model().config().vocab_size,
                       is_adapter_dir(path) ? resolve_base_model_path(path) : path);

  DatasetReaderOptions ro;
  ro.dataset_text_field = a.data.dataset_text_field;
  ro.skip_bad_lines = a.data.skip_bad_lines;
  ro.vocab_size = rm.model().config().vocab_size;
  ro.extract_implicit_prompt = false;
  DatasetReader reader(dataset, ro);
  Record rec;
  std::string out;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<PendingRow> rows;
  int64_t scored = 0;
  auto flush = [&] {
    if (rows.empty()) return;
    const std::vector<double> r = rm.score_sequences(seqs);
    size_t k = 0;
    for (const PendingRow& row : rows) {
      nlohmann::json j = {{"line", row.line}};
      if (row.pair) {
        j["chosen_reward"] = r[k++];
        j["rejected_reward"] = r[k++];
      } else {
        j["reward"] = r[k++];
      }
      out += j.dump() + "\n";
    }
    scored += static_cast<int64_t>(rows.size());
    seqs.clear();
    rows.clear();
  };
  const TextField none;
  while (reader.next(&rec)) {
    const DatasetFormat& f = reader.format();
    const bool conv = f.conversational;
    PendingRow row{rec.line, f.kind == DatasetKind::kPreference};
    try {
      switch (f.kind) {
        case DatasetKind::kLanguageModeling:
          seqs.push_back(reward_sequence_ids(none, rec.text, conv, *enc));
          break;
        case DatasetKind::kPromptCompletion:
        case DatasetKind::kUnpairedPreference:
          seqs.push_back(reward_sequence_ids(rec.prompt, rec.completion, conv, *enc));
          break;
        case DatasetKind::kPreference:
          seqs.push_back(reward_sequence_ids(rec.prompt, rec.chosen, conv, *enc));
          seqs.push_back(reward_sequence_ids(rec.prompt, rec.rejected, conv, *enc));
          break;
        case DatasetKind::kTokenized:
          seqs.push_back(rec.input_ids);
          break;
        case DatasetKind::kPromptOnly:
          LT_THROW(ErrorKind::kInput, "dataset format ", f.name(),
                   " has only prompts; a reward model scores prompt + completion");
      }
    } catch (const Error& e) {
      LT_THROW(e.kind(), dataset, ":", rec.line, ": ", e.what());
    }
    for (size_t i = seqs.size() - (row.pair ? 2 : 1); i < seqs.size(); ++i)
      LT_CHECK_INPUT(!seqs[i].empty(), dataset, ":", rec.line, ": nothing to score (no tokens)");
    rows.push_back(row);
    if (static_cast<int64_t>(rows.size()) >= a.batch_size) flush();
  }
  flush();
  if (output.empty()) {
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else {
    write_text_atomic(output, out);
    std::printf("score: %lld rows scored (%s); rewards written to %s\n",
                static_cast<long long>(scored), reader.bad_lines().summary().c_str(),
                output.c_str());
  }
  return 0;
}

}  // namespace

int cmd_score(const std::vector<std::string>& args) { return score_command(args); }

}  // namespace leantune
