// Native renderers for the ChatML and Llama-3 chat templates (see chat_template.h).
#include "loaders/chat_template.h"

#include <ctime>

#include "engine/check.h"
#include "loaders/tokenizer.h"
#include "loaders/unicode.h"

namespace leantune {

namespace {

constexpr const char* kHint = "pass --chat_template chatml|llama3 to choose one";

// The text of the jinja string literal that starts at src[pos] (just after its opening quote),
// with escapes resolved, up to `stop` (exclusive) or the closing quote.
std::string read_literal(const std::string& src, size_t pos, char quote, const std::string& stop) {
  std::string out;
  while (pos < src.size() && src[pos] != quote) {
    if (src.compare(pos, stop.size(), stop) == 0) break;
    if (src[pos] == '\\' && pos + 1 < src.size()) {
      const char c = src[pos + 1];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
      pos += 2;
      continue;
    }
    out.push_back(src[pos++]);
  }
  return out;
}

// ChatML templates that inject a system prompt when the conversation has none write it as a
// literal '<|im_start|>system\n<prompt><|im_end|>\n' (Qwen2, Qwen2.5, SmolLM2).
std::optional<std::string> chatml_default_system(const std::string& src) {
  const std::string head = "<|im_start|>system\\n";
  for (size_t at = src.find(head); at != std::string::npos; at = src.find(head, at + 1)) {
    if (at == 0) continue;
    const char quote = src[at - 1];
    if (quote != '\'' && quote != '"') continue;
    const size_t body = at + head.size();
    if (body >= src.size() || src[body] == quote) continue;  // '<|im_start|>system\n' + ...
    const size_t end = src.find("<|im_end|>", body);
    const size_t close = src.find(quote, body);
    if (end == std::string::npos || (close != std::string::npos && close < end)) continue;
    return read_literal(src, body, quote, "<|im_end|>");
  }
  return std::nullopt;
}

const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

}  // namespace

ChatTemplate ChatTemplate::from_name(const std::string& name) {
  ChatTemplate t;
  t.name_ = name;
  if (name == "chatml") {
    t.kind_ = ChatTemplateKind::kChatML;
  } else if (name == "qwen2.5") {
    t.kind_ = ChatTemplateKind::kChatML;
    t.default_system_ = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  } else if (name == "llama3") {
    t.kind_ = ChatTemplateKind::kLlama3;
  } else if (name == "llama3.1") {
    t.kind_ = ChatTemplateKind::kLlama3;
    t.llama_system_header_ = true;
  } else if (name == "llama3.2") {
    t.kind_ = ChatTemplateKind::kLlama3;
    t.llama_system_header_ = true;
    t.llama_date_from_clock_ = true;
  } else {
    LT_THROW(ErrorKind::kInput, "unknown chat template '", name,
             "' (known: chatml, qwen2.5, llama3, llama3.1, llama3.2)");
  }
  return t;
}

ChatTemplate ChatTemplate::detect(const std::string& src, const std::string& source_for_errors) {
  LT_CHECK_INPUT(!src.empty(), source_for_errors, " has no chat_template; ", kHint);
  ChatTemplate t;
  if (src.find("<|im_start|>") != std::string::npos) {
    // Templates with reasoning blocks (Qwen3) render differently from plain ChatML.
    LT_CHECK_INPUT(src.find("<think>") == std::string::npos &&
                       src.find("reasoning_content") == std::string::npos,
                   source_for_errors,
                   ": the chat template has reasoning (<think>) blocks, which are not "
                   "supported; ",
                   kHint);
    t.kind_ = ChatTemplateKind::kChatML;
    t.default_system_ = chatml_default_system(src);
    t.name_ = t.default_system_ ? "chatml+default_system" : "chatml";
    return t;
  }
  if (src.find("<|start_header_id|>") != std::string::npos) {
    t.kind_ = ChatTemplateKind::kLlama3;
    t.name_ = "llama3";
    if (src.find("Cutting Knowledge Date") != std::string::npos) {
      t.llama_system_header_ = true;
      t.llama_date_from_clock_ = src.find("strftime_now") != std::string::npos;
      const std::string key = "set date_string = ";
      const size_t at = src.find(key);
      if (at != std::string::npos && at + key.size() < src.size()) {
        const char quote = src[at + key.size()];
        if (quote == '"' || quote == '\'') {
          t.llama_fallback_date_ = read_literal(src, at + key.size() + 1, quote, "\x01");
        }
      }
      t.name_ = t.llama_date_from_clock_ ? "llama3.2" : "llama3.1";
    }
    return t;
  }
  LT_THROW(ErrorKind::kInput, source_for_errors,
           ": the chat template is not one of the supported families (ChatML/Qwen2, Llama-3); ",
           kHint);
}

std::string ChatTemplate::effective_date_string() const {
  if (date_string_) return *date_string_;
  if (!llama_date_from_clock_) return llama_fallback_date_;
  // transformers' strftime_now: datetime.now().strftime("%d %b %Y"), local time.
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char day[8];
  std::snprintf(day, sizeof(day), "%02d", tm.tm_mday);
  return std::string(day) + " " + kMonths[tm.tm_mon] + " " + std::to_string(1900 + tm.tm_year);
}

RenderedChat ChatTemplate::render_with_spans(const std::vector<ChatMessage>& messages,
                                             bool add_generation_prompt) const {
  LT_CHECK_INPUT(!messages.empty(), "a chat conversation needs at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    LT_CHECK_INPUT(r == "system" || r == "user" || r == "assistant", "chat message ", i,
                   " has role '", r, "' (expected system, user or assistant)");
  }
  RenderedChat out;
  std::string& s = out.text;
  size_t first = 0;
  if (kind_ == ChatTemplateKind::kChatML) {
    if (messages[0].role == "system") {
      s += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
      first = 1;
    } else if (default_system_) {
      s += "<|im_start|>system\n" + *default_system_ + "<|im_end|>\n";
    }
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      s += "<|im_start|>" + m.role;
      const size_t begin = s.size();
      s += "\n" + m.content + "<|im_end|>\n";
      if (m.role == "assistant") out.generation_spans.emplace_back(begin, s.size());
    }
    if (add_generation_prompt) s += "<|im_start|>assistant\n";
    return out;
  }
  if (llama_system_header_) {
    std::string system;
    if (messages[0].role == "system") {
      system = unicode::python_strip(messages[0].content);
      first = 1;
    }
    s += bos_token_;
    s += "<|start_header_id|>system<|end_header_id|>\n\n";
    s += "Cutting Knowledge Date: December 2023\n";
    s += "Today Date: " + effective_date_string() + "\n\n";
    s += system + "<|eot_id|>";
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (!llama_system_header_ && i == 0) s += bos_token_;
    s += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    const size_t begin = s.size();
    s += unicode::python_strip(m.content);
    s += "<|eot_id|>";
    if (m.role == "assistant") out.generation_spans.emplace_back(begin, s.size());
  }
  if (add_generation_prompt) s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  return render_with_spans(messages, add_generation_prompt).text;
}

ChatEncoding ChatTemplate::encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt) const {
  const RenderedChat r = render_with_spans(messages, add_generation_prompt);
  EncodingWithOffsets enc = tok.encode_with_offsets(r.text, /*add_special_tokens=*/false);
  ChatEncoding out;
  out.assistant_mask.assign(enc.ids.size(), 0);
  // transformers: mask tokens from char_to_token(span start) to char_to_token(span end - 1),
  // where char_to_token is the first token whose range holds the character.
  auto token_at = [&](size_t byte) -> std::optional<size_t> {
    for (size_t t = 0; t < enc.offsets.size(); ++t) {
      if (enc.offsets[t].first <= byte && byte < enc.offsets[t].second) return t;
    }
    return std::nullopt;
  };
  size_t search_from = 0;
  for (const auto& [b, e] : r.generation_spans) {
    if (e <= b) continue;
    std::optional<size_t> start;
    for (size_t t = search_from; t < enc.offsets.size(); ++t) {
      if (enc.offsets[t].first <= b && b < enc.offsets[t].second) {
        start = t;
        break;
      }
    }
    if (!start) start = token_at(b);
    if (!start) break;
    const size_t last_char = unicode::previous_code_point_start(r.text, e);
    std::optional<size_t> end;
    for (size_t t = *start; t < enc.offsets.size(); ++t) {
      if (enc.offsets[t].first <= last_char && last_char < enc.offsets[t].second) {
        end = t;
        break;
      }
    }
    if (!end) end = token_at(last_char);
    const size_t stop = end ? *end + 1 : enc.ids.size();
    for (size_t t = *start; t < stop; ++t) out.assistant_mask[t] = 1;
    search_from = *start;
  }
  out.ids = std::move(enc.ids);
  return out;
}

}  // namespace leantune
