// trainer_bin generate --model DIR [--base_model DIR] (--prompt S [--chat] | --batch F.jsonl
//                      [--output F] [--batch_size N]) [--max_new_tokens N] [--temperature T]
//                      [--top_k K] [--top_p P] [--min_p P] [--repetition_penalty R] [--seed N]
//                      [--device D]
// Loads an HF model folder (with its tokenizer files), or a PEFT adapter folder on its base, and
// prints the completion of the prompt.
// With --chat the prompt is one user message rendered with the tokenizer's chat template and
// an assistant generation prompt.
// With --batch every row's "prompt" (prompt-only or prompt+completion JSONL; a message list is
// rendered with the chat template and an assistant generation prompt) is completed, batch_size
// prompts at a time through one generate() call, and one JSON line per row is written:
// {"line", "completion", "completion_tokens", "finished_by_eos"}. --output is never an input,
// and is written whole or not at all (output_path.h).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/tool_options.h"
#include "loaders/chat_template.h"
#include "loaders/dataset.h"
#include "loaders/fs_util.h"
#include "loaders/hub_cache.h"
#include "loaders/option_table.h"
#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "models/peft_io.h"
#include "trainers/common/data_options.h"
#include "trainers/common/output_path.h"
#include "trainers/common/peft_options.h"

namespace leantune {
namespace {

struct GenerateArguments : ChatArguments, DeviceArguments {
  std::string model;
  std::string base_model;
  std::string prompt;
  std::string batch;
  std::string output;
  int64_t batch_size = 8;
  bool chat = false;
  int64_t max_new_tokens = 64;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  int64_t seed = 0;
  std::string dtype = "float32";
};

const OptionTable<GenerateArguments>& generate_table() {
  using G = GenerateArguments;
  static const OptionTable<G> t =
      OptionTable<G>()
          .text("model", &G::model,
                "HF model folder (config.json, safetensors, tokenizer files) or a PEFT adapter "
                "folder (adapter_config.json)")
          .text("base_model", &G::base_model,
                "the base model of an adapter folder (default: its base_model_name_or_path)")
          .text("prompt", &G::prompt, "the prompt text")
          .text("batch", &G::batch,
                "JSONL of prompts to complete (prompt-only or prompt+completion rows)")
          .text("output", &G::output, "with --batch: the JSONL written (default: standard output)")
          .integer("batch_size", &G::batch_size, "with --batch: prompts generated together", 1)
          .flag("chat", &G::chat, "render the prompt as a user turn with the chat template")
          .base(chat_table())
          .integer("max_new_tokens", &G::max_new_tokens, "stop after this many new tokens", 1)
          .real("temperature", &G::temperature, "0 = greedy; > 0 samples from softmax(logits / T)",
                0.0)
          .integer("top_k", &G::top_k, "sample among the k most likely tokens (0 = off)", 0)
          .real("top_p", &G::top_p, "nucleus sampling threshold", 0.0, 1.0)
          .real("min_p", &G::min_p,
                "drop tokens below min_p times the most likely token's probability (0 = off)", 0.0,
                1.0)
          .real("repetition_penalty", &G::repetition_penalty,
                "divide (multiply when negative) the logits of tokens already in the prompt or "
                "the completion by this (1 = off)",
                1e-6)
          .integer("seed", &G::seed, "sampling seed", 0)
          .base(device_table())
          .text("dtype", &G::dtype, "compute dtype", {"float32", "bfloat16"});
  return t;
}

// The sampling settings of the options (the eos ids come from the model and its tokenizer).
GenerationConfig generation_config(const GenerateArguments& a) {
  GenerationConfig g;
  g.max_new_tokens = a.max_new_tokens;
  g.temperature = a.temperature;
  g.top_k = a.top_k;
  g.top_p = a.top_p;
  g.min_p = a.min_p;
  g.repetition_penalty = a.repetition_penalty;
  g.seed = static_cast<uint64_t>(a.seed);
  return g;
}

// --batch: the rows' prompts, batch_size at a time, one JSON line per row, to `out` (`name` in
// errors).
void generate_rows(const GenerateArguments& a, const DecoderModel& model,
                   const std::shared_ptr<Tokenizer>& tok, const GenerationConfig& g, std::FILE* out,
                   const std::string& name) {
  const std::string& path = a.batch;
  const std::unique_ptr<TextEncoder> enc = make_text_encoder(tok, a.chat_template);
  DatasetReader reader(path);
  const int64_t batch = a.batch_size;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lines;
  int64_t rows = 0;
  int64_t done = 0;  // rows generated so far: each row samples from its own stream
  auto flush = [&] {
    if (prompts.empty()) return;
    GenerationConfig gb = g;
    gb.first_sequence = done;
    const GenerationResult r = generate(model, prompts, gb);
    done += static_cast<int64_t>(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const nlohmann::json j = {{"line", lines[i]},
                                {"completion", tok->decode(r.tokens[i], true)},
                                {"completion_tokens", r.tokens[i].size()},
                                {"finished_by_eos", static_cast<bool>(r.finished_by_eos[i])}};
      const std::string text = j.dump() + "\n";
      write_bytes(out, text.data(), text.size(), name);
    }
    LT_CHECK_INPUT(std::fflush(out) == 0, name, ": write failed: ", std::strerror(errno));
    prompts.clear();
    lines.clear();
  };
  Record rec;
  while (reader.next(&rec)) {
    const DatasetKind kind = reader.format().kind;
    LT_CHECK_INPUT(kind == DatasetKind::kPromptOnly || kind == DatasetKind::kPromptCompletion, path,
                   ":", rec.line, ": dataset format ", reader.format().name(),
                   " has no prompt to complete");
    prompts.push_back(reader.format().conversational
                          ? enc->encode_chat(rec.prompt.messages, true).ids
                          : enc->encode(rec.prompt.text, true));
    lines.push_back(rec.line);
    ++rows;
    if (static_cast<int64_t>(prompts.size()) == batch) flush();
  }
  flush();
  std::fprintf(stderr, "generate: %lld rows of %s completed\n", static_cast<long long>(rows),
               path.c_str());
}

// --batch to standard output (as it goes), or to --output: written to a temporary file renamed
// once every row is done, so a bad row or a full disk leaves an existing file as it was.
void generate_batch(const GenerateArguments& a, const DecoderModel& model,
                    const std::shared_ptr<Tokenizer>& tok, const GenerationConfig& g) {
  const std::string& out_path = a.output;
  if (out_path.empty()) {
    generate_rows(a, model, tok, g, stdout, "standard output");
    return;
  }
  write_file_atomic(out_path, [&](std::FILE* f) { generate_rows(a, model, tok, g, f, out_path); });
}

int run_generate(const std::vector<std::string>& args) {
  Options o("generate");
  GenerateArguments a;
  if (!parse_tool_options(generate_table(), o, args, a)) return 0;
  LT_CHECK_INPUT(!a.model.empty(), "generate: --model DIR is required");
  LT_CHECK_INPUT(a.prompt.empty() != a.batch.empty(),
                 "generate: give exactly one of --prompt and --batch");
  LT_CHECK_INPUT(a.batch.empty() || !a.chat,
                 "generate: --chat is for --prompt; --batch rows carry their own messages");
  LT_CHECK_INPUT(a.output.empty() || !a.batch.empty(),
                 "generate: --output is for --batch; --prompt prints its completion");
  if (!a.output.empty())
    check_output_file(a.output, "output",
                      {{a.batch, "--batch"},
                       {a.model, "--model"},
                       {a.base_model, "--base_model"},
                       chat_template_input(a)});
  const Device dev = Device::parse(a.device);
  DType dt;
  dtype_from_string(a.dtype, &dt);
  // A PEFT adapter folder loads as AutoPeftModelForCausalLM does: its base (--base_model, or
  // the adapter's base_model_name_or_path) with the adapter attached; the tokenizer comes from
  // the adapter folder when it has one, else from the base.
  const std::string path = resolve_model_path(a.model, "model");  // a Hub ID: its cached snapshot
  std::string tokenizer_dir = path;
  std::shared_ptr<DecoderModel> model;
  if (is_adapter_dir(path)) {
    const std::string base = a.base_model.empty() ? resolve_base_model_path(path) : a.base_model;
    if (!std::filesystem::exists(std::filesystem::path(path) / "tokenizer.json"))
      tokenizer_dir = base;
    model = DecoderModel::load(base, dev, dt);
    PeftSetup peft = load_adapter(path, *model, 0);
    peft.set_training(false);
  } else {
    LT_CHECK_INPUT(a.base_model.empty(),
                   "generate: --base_model is for an adapter "
                   "folder, and ",
                   path, " has no adapter_config.json");
    model = DecoderModel::load(path, dev, dt);
  }
  auto tok = Tokenizer::load(tokenizer_dir);
  apply_chat_options(a, *tok);
  GenerationConfig g = generation_config(a);
  if (auto eos = tok->eos_token_id()) {
    g.eos_token_ids = model->config().eos_token_ids;
    if (std::find(g.eos_token_ids.begin(), g.eos_token_ids.end(), *eos) == g.eos_token_ids.end())
      g.eos_token_ids.push_back(*eos);
  }
  if (!a.batch.empty()) {
    generate_batch(a, *model, tok, g);
    return 0;
  }
  std::vector<int32_t> ids;
  if (a.chat) {
    ids = tok->chat_template().encode(*tok, {ChatMessage{"user", a.prompt}}, true).ids;
  } else {
    ids = tok->encode(a.prompt, true);
  }
  GenerationResult r = generate(*model, {ids}, g);
  std::printf("%s\n", tok->decode(r.tokens[0], true).c_str());
  return 0;
}

}  // namespace

int cmd_generate(const std::vector<std::string>& args) { return run_generate(args); }

}  // namespace leantune
