// `trainer_bin tokenize`: encode text, render+encode a chat, or decode ids with a tokenizer.json.
//
//   trainer_bin tokenize --tokenizer PATH (--text S | --file F) [--add_special_tokens]
//   trainer_bin tokenize --tokenizer PATH (--text S | --file F) --chat [--add_generation_prompt]
//                        [--chat_template chatml|qwen2.5|llama3|llama3.1|llama3.2]
//                        [--date_string "26 Jul 2024"] [--assistant_mask]
//   trainer_bin tokenize --tokenizer PATH (--text S | --file F) --decode [--skip_special_tokens]
//
// Encoding prints the ids as one JSON array line. --chat reads a JSON list of {"role",
// "content"} messages and prints the ids of the rendered conversation (with --assistant_mask, a
// JSON object {"ids": [...], "assistant_mask": [...]}). --decode reads a JSON array of ids and
// prints the text followed by a newline. Nothing else goes to stdout. --file - reads stdin.
// Bad input or usage throws Error(kInput) (exit 2 through main.cpp), with one line naming it.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/check.h"
#include "loaders/chat_template.h"
#include "loaders/fs_util.h"
#include "loaders/tokenizer.h"
#include "trainers/commands.h"

namespace leantune {
namespace {

using nlohmann::json;

std::string read_input(const std::string& text, const std::string& file, bool have_text) {
  if (have_text) return text;
  if (file == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  return read_text_file(file);
}

json parse_input_json(const std::string& input, const std::string& what) {
  try {
    return json::parse(input);
  } catch (const json::exception& e) {
    LT_THROW(ErrorKind::kInput, "tokenize: the input is not ", what, ": ", e.what());
  }
}

std::vector<int32_t> parse_ids(const std::string& input) {
  const json j = parse_input_json(input, "a JSON array of token ids");
  LT_CHECK_INPUT(j.is_array(), "tokenize --decode: the input must be a JSON array of ids");
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    LT_CHECK_INPUT(j[i].is_number_integer(), "tokenize --decode: element ", i, " (", j[i].dump(),
                   ") is not an integer id");
    const auto v = j[i].get<int64_t>();
    LT_CHECK_INPUT(
        v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
        "tokenize --decode: element ", i, " (", v, ") is out of range");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

std::vector<ChatMessage> parse_messages(const std::string& input) {
  const json j = parse_input_json(input, "a JSON list of {\"role\", \"content\"} messages");
  LT_CHECK_INPUT(j.is_array(), "tokenize --chat: the input must be a JSON list of messages");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& m = j[i];
    LT_CHECK_INPUT(m.is_object() && m.contains("role") && m["role"].is_string() &&
                       m.contains("content") && m["content"].is_string(),
                   "tokenize --chat: message ", i,
                   " must be an object with string \"role\" and \"content\"");
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

int run_tokenize(const std::vector<std::string>& args) {
  CLI::App app{"Encodes text (or a chat) to token ids, or decodes ids, with a tokenizer.json.",
               "trainer_bin tokenize"};
  std::string tokenizer_path, text, file, chat_template, date_string;
  bool chat = false, add_special = false, decode = false, skip_special = false;
  bool add_generation_prompt = false, assistant_mask = false;
  app.add_option("--tokenizer", tokenizer_path,
                 "a model folder with tokenizer.json (+ tokenizer_config.json), or a "
                 "tokenizer.json")
      ->required();
  auto* text_opt = app.add_option("--text", text, "the input");
  auto* file_opt = app.add_option("--file", file, "read the input from this file ('-': stdin)");
  text_opt->excludes(file_opt);
  file_opt->excludes(text_opt);
  app.add_flag("--add_special_tokens", add_special,
               "let the post-processor add its special tokens (e.g. Llama-3's BOS)");
  app.add_flag("--chat", chat, "the input is a JSON list of {\"role\", \"content\"} messages");
  app.add_option("--chat_template", chat_template,
                 "with --chat: chatml | qwen2.5 | llama3 | llama3.1 | llama3.2 instead of the "
                 "template in tokenizer_config.json");
  app.add_flag("--add_generation_prompt", add_generation_prompt,
               "with --chat: end with the assistant header");
  app.add_option("--date_string", date_string, "with --chat: Llama-3.1/3.2 'Today Date'");
  app.add_flag("--assistant_mask", assistant_mask,
               "with --chat: print {\"ids\", \"assistant_mask\"}");
  app.add_flag("--decode", decode, "the input is a JSON array of ids; print the text");
  app.add_flag("--skip_special_tokens", skip_special, "with --decode: drop special tokens");
  try {
    std::vector<std::string> rev(args.rbegin(), args.rend());
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    LT_THROW(ErrorKind::kInput, "tokenize: ", e.what(), " (run 'trainer_bin tokenize --help')");
  }
  const bool have_text = text_opt->count() > 0;
  LT_CHECK_INPUT(have_text || file_opt->count() > 0,
                 "tokenize: give the input with --text or --file");
  LT_CHECK_INPUT(!(chat && decode), "tokenize: --chat and --decode exclude each other");
  LT_CHECK_INPUT(chat || (chat_template.empty() && date_string.empty() && !assistant_mask &&
                          !add_generation_prompt),
                 "tokenize: --chat_template, --date_string, --add_generation_prompt and "
                 "--assistant_mask need --chat");
  LT_CHECK_INPUT(decode || !skip_special, "tokenize: --skip_special_tokens needs --decode");

  const std::string input = read_input(text, file, have_text);
  auto tok = Tokenizer::load(tokenizer_path);
  if (decode) {
    const std::string out = tok->decode(parse_ids(input), skip_special);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  if (chat) {
    const std::vector<ChatMessage> messages = parse_messages(input);
    if (!chat_template.empty()) tok->set_chat_template(chat_template);
    ChatTemplate tmpl = tok->chat_template();
    if (!date_string.empty()) tmpl.set_date_string(date_string);
    const ChatEncoding enc = tmpl.encode(*tok, messages, add_generation_prompt);
    if (assistant_mask) {
      const json out{{"ids", enc.ids}, {"assistant_mask", enc.assistant_mask}};
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::printf("%s\n", json(enc.ids).dump().c_str());
    }
    return 0;
  }
  std::printf("%s\n", json(tok->encode(input, add_special)).dump().c_str());
  return 0;
}

const CommandRegistration kTokenize("tokenize", "encode text or a chat to token ids, or decode ids",
                                    run_tokenize);

}  // namespace
}  // namespace leantune
