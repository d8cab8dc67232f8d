// trainer_bin generate --model DIR [--base_model DIR] --prompt S [--chat] [--max_new_tokens N]
//                      [--temperature T] [--top_k K] [--top_p P] [--seed N] [--device D]
// Loads an HF model folder (with its tokenizer files), or a PEFT adapter folder on its base, and
// prints the completion of the prompt.
// With --chat the prompt is one user message rendered with the tokenizer's chat template and
// an assistant generation prompt.
#include <cstdio>
#include <filesystem>

#include "loaders/chat_template.h"
#include "loaders/tokenizer.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "models/peft_io.h"
#include "trainers/commands.h"
#include "trainers/data_options.h"
#include "trainers/options.h"
#include "trainers/peft_options.h"

namespace leantune {
namespace {

int run_generate(const std::vector<std::string>& args) {
  Options o("generate");
  o.add_string("model", "",
               "HF model folder (config.json, safetensors, tokenizer files) or a PEFT adapter "
               "folder (adapter_config.json)");
  o.add_string("base_model", "",
               "the base model of an adapter folder (default: its base_model_name_or_path)");
  o.add_string("prompt", "", "the prompt text");
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
  LT_CHECK_INPUT(!o.get_string("prompt").empty(), "generate: --prompt is required");
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
  std::vector<int32_t> ids;
  if (o.get_bool("chat")) {
    ids =
        tok->chat_template().encode(*tok, {ChatMessage{"user", o.get_string("prompt")}}, true).ids;
  } else {
    ids = tok->encode(o.get_string("prompt"), true);
  }
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
  GenerationResult r = generate(*model, {ids}, g);
  std::printf("%s\n", tok->decode(r.tokens[0], true).c_str());
  return 0;
}

CommandRegistration reg("generate", "generate a completion from an HF model folder", run_generate);

}  // namespace
}  // namespace leantune
