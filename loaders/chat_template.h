// Chat templates rendered natively (no jinja engine): the ChatML family (Qwen2, Qwen2.5,
// SmolLM2) and the Llama-3 family (3.0 plain headers; 3.1/3.2 with the "Cutting Knowledge
// Date" system header).
//
// Contract: render() returns byte for byte what transformers' apply_chat_template(messages,
// tokenize=False, add_generation_prompt=...) returns for the template it was detected from
// (tool calls are not supported). encode() returns the ids of apply_chat_template(
// tokenize=True) (the rendered text encoded without add_special_tokens) and an assistant mask
// with TRL's {% generation %} semantics (trl/chat_templates/*_training.jinja):
//   ChatML: '\n' + content + '<|im_end|>\n' of each assistant turn (after '<|im_start|>assistant');
//   Llama-3: content|trim + '<|eot_id|>' of each assistant turn.
// A token is marked as transformers does it: from the token holding the span's first character
// to the token holding its last character.
//
// Names for from_name(): "chatml" (no default system prompt), "qwen2.5" (ChatML with Qwen2.5's
// default system prompt), "llama3" (Llama 3.0: bos + plain headers), "llama3.1"/"llama3.2"
// (system header with knowledge cutoff and date). detect() recognises the jinja source by
// distinctive substrings and reads the default system prompt / date rule from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace leantune {

class Tokenizer;

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatEncoding {
  std::vector<int32_t> ids;
  std::vector<uint8_t> assistant_mask;  // mask[i]=1 for tokens the assistant produced
};

// The rendered text and the byte ranges [begin, end) that TRL's generation blocks cover.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

enum class ChatTemplateKind { kChatML, kLlama3 };

class ChatTemplate {
 public:
  // "chatml" | "qwen2.5" | "llama3" | "llama3.1" | "llama3.2"; Error(kInput) otherwise.
  static ChatTemplate from_name(const std::string& name);
  // Error(kInput) naming source_for_errors and suggesting --chat_template chatml|llama3 when
  // the source is empty or not of a known family.
  static ChatTemplate detect(const std::string& jinja_source, const std::string& source_for_errors);

  ChatTemplateKind kind() const { return kind_; }
  const std::string& name() const { return name_; }

  // Messages must be non-empty with roles system|user|assistant (Error(kInput) otherwise).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  RenderedChat render_with_spans(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const;
  // Tokenizes the rendered conversation (as transformers' apply_chat_template(tokenize=True)
  // does) and marks assistant tokens.
  ChatEncoding encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                      bool add_generation_prompt) const;

  // Llama-3.1/3.2 "Today Date" override (e.g. "26 Jul 2024"). Without it the date is the
  // template's rule: today's date as strftime("%d %b %Y") where the template calls
  // strftime_now (as transformers provides it), else the template's fixed fallback.
  void set_date_string(std::string date) { date_string_ = std::move(date); }
  // The date string render() uses now.
  std::string effective_date_string() const;
  // ChatML default system prompt used when the first message is not a system message.
  const std::optional<std::string>& default_system_prompt() const { return default_system_; }
  // The BOS text the Llama-3 templates start with (bos_token in jinja).
  void set_bos_token(std::string bos) { bos_token_ = std::move(bos); }

 private:
  ChatTemplate() = default;

  ChatTemplateKind kind_ = ChatTemplateKind::kChatML;
  std::string name_;
  std::optional<std::string> default_system_;  // ChatML
  bool llama_system_header_ = false;           // Llama-3.1/3.2 date header
  bool llama_date_from_clock_ = false;         // template uses strftime_now
  std::string llama_fallback_date_ = "26 Jul 2024";
  std::optional<std::string> date_string_;
  std::string bos_token_ = "<|begin_of_text|>";
};

}  // namespace leantune
