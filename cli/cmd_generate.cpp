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
#include "loaders/chat_template.h"
#include "loaders/dataset.h"
#include "loaders/fs_util.h"
#include "loaders/options.h"
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

// --batch: the rows' prompts, batch_size at a time, one JSON line per row, to `out` (`name` in
// errors).
void generate_rows(const Options& o, const DecoderModel& model,
                   const std::shared_ptr<Tokenizer>& tok, const GenerationConfig& g, std::FILE* out,
                   const std::string& name) {
  const std::string path = o.get_string("batch");
  const std::unique_ptr<TextEncoder> enc = make_text_encoder(tok, o.get_string("chat_template"));
  DatasetReader reader(path);
  const int64_t batch = o.get_int("batch_size");
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
void generate_batch(const Options& o, const DecoderModel& model,
                    const std::shared_ptr<Tokenizer>& tok, const GenerationConfig& g) {
  const std::string out_path = o.get_string("output");
  if (out_path.empty()) {
    generate_rows(o, model, tok, g, stdout, "standard output");
    return;
  }
  write_file_atomic(out_path, [&](std::FILE* f) { generate_rows(o, model, tok, g, f, out_path); });
}

int run_generate(const std::vector<std::string>& args) {
  Options o("generate");
  o.add_string("model", "",
               "HF model folder (config.json, safetensors, tokenizer files) or a PEFT adapter "
               "folder (adapter_config.json)");
  o.add_string("base_model", "",
               "the base model of an adapter folder (default: its base_model_name_or_path)");
  o.add_string("prompt", "", "the prompt text");
  o.add_string("batch", "", "JSONL of prompts to complete (prompt-only or prompt+completion rows)");
  o.add_string("output", "", "with --batch: the JSONL written (default: standard output)");
  o.add_int("batch_size", 8, "with --batch: prompts generated together", 1);
  o.add_bool("chat", false, "render the prompt as a user turn with the chat template");
  add_chat_options(o);
  o.add_int("max_new_tokens", 64, "stop after this many new tokens", 1);
  o.add_float("temperature", 0.0, "0 = greedy; > 0 samples from softmax(logits / T)", 0.0);
  o.add_int("top_k", 0, "sample among the k most likely tokens (0 = off)", 0);
  o.add_float("top_p", 1.0, "nucleus sampling threshold", 0.0, 1.0);
  o.add_float("min_p", 0.0,
              "drop tokens below min_p times the most likely token's probability (0 = off)", 0.0,
              1.0);
  o.add_float("repetition_penalty", 1.0,
              "divide (multiply when negative) the logits of tokens already in the prompt or the "
              "completion by this (1 = off)",
              1e-6);
  o.add_int("seed", 0, "sampling seed", 0);
  o.add_string("device", "auto", "cpu, cuda, cuda:N or auto");
  o.add_string("dtype", "float32", "compute dtype", {"float32", "bfloat16"});
  if (!o.parse(args)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  LT_CHECK_INPUT(!o.get_string("model").empty(), "generate: --model DIR is required");
  LT_CHECK_INPUT(o.get_string("prompt").empty() != o.get_string("batch").empty(),
                 "generate: give exactly one of --prompt and --batch");
  LT_CHECK_INPUT(o.get_string("batch").empty() || !o.get_bool("chat"),
                 "generate: --chat is for --prompt; --batch rows carry their own messages");
  LT_CHECK_INPUT(o.get_string("output").empty() || !o.get_string("batch").empty(),
                 "generate: --output is for --batch; --prompt prints its completion");
  if (!o.get_string("output").empty())
    check_output_file(o.get_string("output"), "output",
                      {{o.get_string("batch"), "--batch"},
                       {o.get_string("model"), "--model"},
                       {o.get_string("base_model"), "--base_model"},
                       chat_template_input(o)});
  const Device dev = Device::parse(o.get_string("device"));
  DType dt;
  dtype_from_string(o.get_string("dtype"), &dt);
  // A PEFT adapter folder loads as AutoPeftModelForCausalLM does: its base (--base_model, or
  // the adapter's base_model_name_or_path) with the adapter attached; the tokenizer comes from
  // the adapter folder when it has one, else from the base.
  const std::string path = o.get_string("model");
  std::string tokenizer_dir = path;
  std::shared_ptr<DecoderModel> model;
  if (is_adapter_dir(path)) {
    const std::string base = o.get_string("base_model").empty() ? resolve_base_model_path(path)
                                                                : o.get_string("base_model");
    if (!std::filesystem::exists(std::filesystem::path(path) / "tokenizer.json"))
      tokenizer_dir = base;
    model = DecoderModel::load(base, dev, dt);
    PeftSetup peft = load_adapter(path, *model, 0);
    peft.set_training(false);
  } else {
    LT_CHECK_INPUT(o.get_string("base_model").empty(),
                   "generate: --base_model is for an adapter "
                   "folder, and ",
                   path, " has no adapter_config.json");
    model = DecoderModel::load(path, dev, dt);
  }
  auto tok = Tokenizer::load(tokenizer_dir);
  apply_chat_options(o, *tok);
  GenerationConfig g;
  g.max_new_tokens = o.get_int("max_new_tokens");
  g.temperature = o.get_float("temperature");
  g.top_k = o.get_int("top_k");
  g.top_p = o.get_float("top_p");
  g.min_p = o.get_float("min_p");
  g.repetition_penalty = o.get_float("repetition_penalty");
  g.seed = static_cast<uint64_t>(o.get_int("seed"));
  if (auto eos = tok->eos_token_id()) {
    g.eos_token_ids = model->config().eos_token_ids;
    if (std::find(g.eos_token_ids.begin(), g.eos_token_ids.end(), *eos) == g.eos_token_ids.end())
      g.eos_token_ids.push_back(*eos);
  }
  if (!o.get_string("batch").empty()) {
    generate_batch(o, *model, tok, g);
    return 0;
  }
  std::vector<int32_t> ids;
  if (o.get_bool("chat")) {
    ids =
        tok->chat_template().encode(*tok, {ChatMessage{"user", o.get_string("prompt")}}, true).ids;
  } else {
    ids = tok->encode(o.get_string("prompt"), true);
  }
  GenerationResult r = generate(*model, {ids}, g);
  std::printf("%s\n", tok->decode(r.tokens[0], true).c_str());
  return 0;
}

}  // namespace

int cmd_generate(const std::vector<std::string>& args) { return run_generate(args); }

}  // namespace leantune
