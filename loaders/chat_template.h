// Chat templates, run by the Jinja2 interpreter (loaders/jinja) exactly as transformers'
// apply_chat_template runs them.
//
// Contract: render() returns byte for byte what apply_chat_template(messages, tools=...,
// add_generation_prompt=..., tokenize=False, **kwargs) returns; the template sees `messages`
// (message keys whose value is null dropped, as transformers does), `tools`, `documents`
// (none), `add_generation_prompt`, the tokenizer's special tokens (bos_token, eos_token,
// pad_token, unk_token) and the extra kwargs (TRL's chat_template_kwargs). encode() returns the
// ids of apply_chat_template(tokenize=True) (the rendered text encoded without
// add_special_tokens) and the assistant mask of return_assistant_tokens_mask=True: from the
// token holding the first character of each {% generation %} span to the token holding its
// last character.
//
// Where the template has no {% generation %} block, the mask comes from the bundled training
// variant of its family (loaders/jinja/templates/*_training.jinja: ChatML, Qwen2.5, SmolLM2,
// Llama-3.0/3.1/3.2, as TRL's trl/chat_templates/*_training.jinja) when that variant renders the
// conversation to the same text; the mask is then TRL's:
//   ChatML: '\n' + content + '<|im_end|>\n' of each assistant turn (after '<|im_start|>assistant');
//   Llama-3: content|trim + '<|eot_id|>' of each assistant turn.
// Otherwise there is no mask (has_assistant_mask() false; encode() leaves it empty), and
// assistant_only_loss is refused with assistant_mask_error().
//
// Errors are Error(kInput): template syntax/evaluation errors as "<source>:<line>:<col>: ...",
// unknown --chat_template names, unreadable template files.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace leantune {

class Tokenizer;
namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatEncoding {
  std::vector<int32_t> ids;
  std::vector<uint8_t> assistant_mask;  // mask[i]=1 for assistant tokens; empty: no mask
};

// The rendered text and the byte ranges [begin, end) of its {% generation %} spans.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;
  bool has_spans = false;  // the spans are known (the template or its training variant)
};

// What apply_chat_template receives, as JSON (key order kept: tojson prints it).
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null or a list of tool schemas
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra template variables
  bool add_generation_prompt = false;
};

// --chat_template_kwargs text -> a JSON object; Error(kInput) naming the option otherwise.
nlohmann::ordered_json parse_chat_template_kwargs(const std::string& text);

// The variables the renderer binds itself: messages, tools, documents, add_generation_prompt and
// the special tokens (bos_token, eos_token, unk_token, pad_token).
const std::vector<std::string>& chat_template_variables();
// Error(kInput) "<what>: key 'K' is the chat template's own variable ..." when kwargs would
// replace one of chat_template_variables() (e.g. "messages" would replace every conversation).
void check_chat_template_kwargs(const nlohmann::ordered_json& kwargs, const std::string& what);

class ChatTemplate {
 public:
  // A bundled name ("chatml" | "qwen2.5" | "qwen3" | "llama3" | "llama3.1" | "llama3.2" |
  // "gemma3") or the path of a .jinja file; Error(kInput) otherwise.
  static ChatTemplate from_name(const std::string& name_or_path);
  // A template text; `source` names it in errors (e.g. "<dir>/tokenizer_config.json").
  static ChatTemplate from_source(const std::string& text, const std::string& source);
  // As from_source, with Error(kInput) naming source_for_errors when the text is empty.
  static ChatTemplate detect(const std::string& text, const std::string& source_for_errors);
  // Names accepted by from_name().
  static std::vector<std::string> bundled_names();

  const std::string& name() const { return name_; }

  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  RenderedChat render_with_spans(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const;
  RenderedChat render_request(const ChatRequest& request) const;
  ChatEncoding encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                      bool add_generation_prompt) const;
  ChatEncoding encode_request(const Tokenizer& tok, const ChatRequest& request) const;

  // Whether encode() gives an assistant mask (own {% generation %} blocks or a matching
  // training variant); the one-line reason when not.
  bool has_assistant_mask() const { return own_generation_ || training_ != nullptr; }
  std::string assistant_mask_error() const;

  // Special tokens the template sees (bos_token, eos_token, ...): set from the tokenizer.
  void set_special_token(const std::string& key, const std::string& value);
  void set_bos_token(std::string bos) { set_special_token("bos_token", bos); }
  // Extra template variables (TRL's chat_template_kwargs, e.g. {"enable_thinking": false});
  // Error(kInput) unless an object, or when a key is one of chat_template_variables().
  void set_kwargs(const nlohmann::ordered_json& kwargs);
  const nlohmann::ordered_json& kwargs() const { return kwargs_; }
  // Llama-3.1/3.2 "Today Date": the date_string template variable.
  void set_date_string(std::string date) { kwargs_["date_string"] = std::move(date); }
  // The clock strftime_now() reads (default: local time now).
  void set_now(const std::tm& now) { now_ = now; }

 private:
  ChatTemplate() = default;
  void find_training_variant();
  RenderedChat render_with(const jinja::Template& t, const ChatRequest& r) const;

  std::string name_;
  std::string source_text_;  // the template's text (the identity rule of find_training_variant)
  std::shared_ptr<const jinja::Template> template_;
  std::shared_ptr<const jinja::Template> training_;  // family training variant, when it matches
  std::string training_name_;
  bool own_generation_ = false;
  nlohmann::ordered_json special_ = nlohmann::ordered_json::object();
  nlohmann::ordered_json kwargs_ = nlohmann::ordered_json::object();
  std::optional<std::tm> now_;
};

}  // namespace leantune
