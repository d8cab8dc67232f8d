// `trainer_bin tokenize`: encode text, render+encode a chat, or decode ids with a tokenizer.json.
//
//   trainer_bin tokenize --tokenizer PATH (--text S | --file F) [--add_special_tokens]
//   trainer_bin tokenize --tokenizer PATH (--text S | --file F) --chat [--add_generation_prompt]
//                        [--chat_template NAME|FILE.jinja] [--chat_template_kwargs JSON]
//                        [--date_string "26 Jul 2024"] [--assistant_mask]
//   trainer_bin tokenize --tokenizer PATH (--text S | --file F) --decode [--skip_special_tokens]
//
// Encoding prints the ids as one JSON array line. --chat reads a JSON list of messages, or a
// dataset row {"messages": [...], "tools": [...], "chat_template_kwargs": {...}} (TRL's
// conversational format with tools), and prints the ids apply_chat_template(tokenize=True)
// gives (with --assistant_mask, a JSON object {"ids": [...], "assistant_mask": [...]}). --decode
// reads a JSON array of ids and prints the text followed by a newline. Nothing else goes to stdout.
// --file - reads stdin. Bad input or usage throws Error(kInput) (exit 2 through main.cpp), with one
// line naming it.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/tool_options.h"
#include "engine/check.h"
#include "loaders/chat_template.h"
#include "loaders/fs_util.h"
#include "loaders/option_table.h"
#include "loaders/tokenizer.h"
#include "trainers/common/data_options.h"

namespace leantune {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

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

// --chat input: a JSON list of messages, or a dataset row {"messages": [...], "tools": [...],
// "chat_template_kwargs": {...}} as in TRL's conversational datasets with tools.
ChatRequest parse_chat(const std::string& input) {
  ojson j;
  try {
    j = ojson::parse(input);
  } catch (const ojson::exception& e) {
    LT_THROW(ErrorKind::kInput,
             "tokenize --chat: the input is not a JSON list of messages or a {\"messages\": "
             "[...]} row: ",
             e.what());
  }
  ChatRequest r;
  if (j.is_object()) {
    LT_CHECK_INPUT(j.contains("messages") && j["messages"].is_array(),
                   "tokenize --chat: a row needs a \"messages\" list");
    r.messages = j["messages"];
    if (j.contains("tools") && !j["tools"].is_null()) {
      LT_CHECK_INPUT(j["tools"].is_array(), "tokenize --chat: \"tools\" must be a list");
      r.tools = j["tools"];
    }
    if (j.contains("chat_template_kwargs")) {
      LT_CHECK_INPUT(j["chat_template_kwargs"].is_object(),
                     "tokenize --chat: \"chat_template_kwargs\" must be an object");
      r.kwargs = j["chat_template_kwargs"];
      check_chat_template_kwargs(r.kwargs, "tokenize --chat: \"chat_template_kwargs\"");
    }
  } else {
    LT_CHECK_INPUT(j.is_array(),
                   "tokenize --chat: the input must be a JSON list of messages or a "
                   "{\"messages\": [...]} row");
    r.messages = j;
  }
  for (size_t i = 0; i < r.messages.size(); ++i) {
    const ojson& m = r.messages[i];
    LT_CHECK_INPUT(m.is_object() && m.contains("role") && m["role"].is_string(),
                   "tokenize --chat: message ", i, " must be an object with a string \"role\"");
  }
  return r;
}

struct TokenizeArguments : ChatArguments {
  std::string tokenizer;
  std::string text;
  std::string file;
  bool add_special_tokens = false;
  bool chat = false;
  bool add_generation_prompt = false;
  std::string date_string;
  bool assistant_mask = false;
  bool decode = false;
  bool skip_special_tokens = false;
};

const OptionTable<TokenizeArguments>& tokenize_table() {
  using T = TokenizeArguments;
  static const OptionTable<T> t =
      OptionTable<T>()
          .text("tokenizer", &T::tokenizer,
                "a model folder with tokenizer.json (+ tokenizer_config.json), or a tokenizer.json")
          .text("text", &T::text, "the input")
          .text("file", &T::file, "read the input from this file ('-': stdin)")
          .flag("add_special_tokens", &T::add_special_tokens,
                "let the post-processor add its special tokens (e.g. Llama-3's BOS)")
          .flag("chat", &T::chat,
                "the input is a JSON list of messages or a {\"messages\", \"tools\"} row")
          .base(chat_table())
          .flag("add_generation_prompt", &T::add_generation_prompt,
                "with --chat: end with the assistant header")
          .text("date_string", &T::date_string,
                "with --chat: the template's date_string (Llama-3.1/3.2)")
          .flag("assistant_mask", &T::assistant_mask,
                "with --chat: print {\"ids\", \"assistant_mask\"}")
          .flag("decode", &T::decode, "the input is a JSON array of ids; print the text")
          .flag("skip_special_tokens", &T::skip_special_tokens,
                "with --decode: drop special tokens");
  return t;
}

int run_tokenize(const std::vector<std::string>& args) {
  Options o("tokenize");
  TokenizeArguments a;
  if (!parse_tool_options(tokenize_table(), o, args, a)) return 0;
  LT_CHECK_INPUT(!a.tokenizer.empty(), "tokenize: --tokenizer PATH is required");
  // Given at all, even empty: --text "" is an empty input.
  const bool have_text = o.is_set("text"), have_file = o.is_set("file");
  LT_CHECK_INPUT(!(have_text && have_file), "tokenize: --text excludes --file");
  LT_CHECK_INPUT(have_text || have_file, "tokenize: give the input with --text or --file");
  LT_CHECK_INPUT(!(a.chat && a.decode), "tokenize: --chat and --decode exclude each other");
  LT_CHECK_INPUT(
      a.chat || (!o.is_set("chat_template") && !o.is_set("chat_template_kwargs") &&
                 !o.is_set("date_string") && !a.assistant_mask && !a.add_generation_prompt),
      "tokenize: --chat_template, --chat_template_kwargs, --date_string, "
      "--add_generation_prompt and --assistant_mask need --chat");
  LT_CHECK_INPUT(a.decode || !a.skip_special_tokens,
                 "tokenize: --skip_special_tokens needs --decode");

  const std::string input = read_input(a.text, a.file, have_text);
  auto tok = Tokenizer::load(a.tokenizer);
  if (a.decode) {
    const std::string out = tok->decode(parse_ids(input), a.skip_special_tokens);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  if (a.chat) {
    ChatRequest request = parse_chat(input);
    request.add_generation_prompt = a.add_generation_prompt;
    apply_chat_options(a, *tok);
    ChatTemplate tmpl = tok->chat_template();
    if (!a.date_string.empty()) tmpl.set_date_string(a.date_string);
    const ChatEncoding enc = tmpl.encode_request(*tok, request);
    if (a.assistant_mask) {
      LT_CHECK_INPUT(enc.assistant_mask.size() == enc.ids.size(), "tokenize --assistant_mask: ",
                     tmpl.has_assistant_mask()
                         ? "the template's training variant renders this conversation differently"
                         : tmpl.assistant_mask_error());
      const json out{{"ids", enc.ids}, {"assistant_mask", enc.assistant_mask}};
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::printf("%s\n", json(enc.ids).dump().c_str());
    }
    return 0;
  }
  std::printf("%s\n", json(tok->encode(input, a.add_special_tokens)).dump().c_str());
  return 0;
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& args) { return run_tokenize(args); }

}  // namespace leantune
