// Chat templates through the Jinja2 interpreter, with transformers' inputs and assistant-mask
// rules (see chat_template.h).
#include "loaders/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/check.h"
#include "loaders/jinja/bundled.h"
#include "loaders/jinja/interpreter.h"
#include "loaders/tokenizer.h"
#include "loaders/unicode.h"

namespace leantune {

namespace {

using ojson = nlohmann::ordered_json;

const char* bundled_text(const std::string& name) {
  for (const auto& t : jinja::bundled_templates()) {
    if (name == t.name) return t.text;
  }
  return nullptr;
}

// Parsed bundled training variants, built once.
const std::vector<std::pair<std::string, std::shared_ptr<const jinja::Template>>>&
training_variants() {
  static const auto kAll = [] {
    std::vector<std::pair<std::string, std::shared_ptr<const jinja::Template>>> out;
    for (const auto& t : jinja::bundled_templates()) {
      const std::string name = t.name;
      if (name.size() > 9 && name.compare(name.size() - 9, 9, "_training") == 0) {
        out.emplace_back(
            name, std::make_shared<const jinja::Template>(t.text, "<bundled>/" + name + ".jinja"));
      }
    }
    return out;
  }();
  return kAll;
}

ojson messages_json(const std::vector<ChatMessage>& messages) {
  ojson out = ojson::array();
  for (const ChatMessage& m : messages) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

ChatRequest request_of(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  ChatRequest r;
  r.messages = messages_json(messages);
  r.add_generation_prompt = add_generation_prompt;
  return r;
}

std::tm local_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

}  // namespace

ojson parse_chat_template_kwargs(const std::string& text) {
  ojson j;
  try {
    j = ojson::parse(text);
  } catch (const std::exception& e) {
    LT_THROW(ErrorKind::kInput, "--chat_template_kwargs: not valid JSON: ", e.what());
  }
  LT_CHECK_INPUT(j.is_object(), "--chat_template_kwargs must be a JSON object, got ", text);
  return j;
}

const std::vector<std::string>& chat_template_variables() {
  static const std::vector<std::string> names = {
      "messages",  "tools",     "documents", "add_generation_prompt",
      "bos_token", "eos_token", "unk_token", "pad_token"};
  return names;
}

void check_chat_template_kwargs(const ojson& kwargs, const std::string& what) {
  const std::vector<std::string>& own = chat_template_variables();
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
    if (std::find(own.begin(), own.end(), it.key()) == own.end()) continue;
    std::string list;
    for (const std::string& n : own) list += (list.empty() ? "" : ", ") + n;
    LT_THROW(ErrorKind::kInput, what, ": key '", it.key(),
             "' is the chat template's own variable (kwargs may not replace ", list, ")");
  }
}

std::vector<std::string> ChatTemplate::bundled_names() {
  std::vector<std::string> out;
  for (const auto& t : jinja::bundled_templates()) {
    const std::string n = t.name;
    if (n.find("_training") == std::string::npos) out.push_back(n);
  }
  return out;
}

ChatTemplate ChatTemplate::from_name(const std::string& name) {
  const bool training = name.find("_training") != std::string::npos;
  if (const char* text = training ? nullptr : bundled_text(name)) {
    ChatTemplate t = from_source(text, "<bundled>/" + name + ".jinja");
    t.name_ = name;
    return t;
  }
  std::error_code ec;
  if (!name.empty() && std::filesystem::is_regular_file(name, ec)) {
    std::ifstream f(name, std::ios::binary);
    LT_CHECK_INPUT(f.good(), "--chat_template: cannot read ", name);
    std::stringstream ss;
    ss << f.rdbuf();
    const size_t bad = unicode::find_invalid(ss.str());
    LT_CHECK_INPUT(bad == std::string::npos, "option --chat_template: '", name,
                   "' is not valid UTF-8 (byte ", bad, ")");
    return from_source(ss.str(), name);
  }
  std::string known;
  for (const std::string& n : bundled_names()) known += (known.empty() ? "" : ", ") + n;
  LT_THROW(ErrorKind::kInput, "unknown chat template '", name, "' (known: ", known,
           "; or the path of a .jinja file)");
}

ChatTemplate ChatTemplate::from_source(const std::string& text, const std::string& source) {
  const size_t bad = unicode::find_invalid(text);
  LT_CHECK_INPUT(bad == std::string::npos, source, ": the chat template is not valid UTF-8 (byte ",
                 bad, ")");
  ChatTemplate t;
  t.name_ = source;
  t.source_text_ = text;
  t.template_ = std::make_shared<const jinja::Template>(text, source);
  t.own_generation_ = t.template_->has_generation();
  t.find_training_variant();
  return t;
}

ChatTemplate ChatTemplate::detect(const std::string& text, const std::string& source_for_errors) {
  LT_CHECK_INPUT(!text.empty(), source_for_errors,
                 " has no chat_template; pass --chat_template NAME|FILE.jinja to choose one");
  return from_source(text, source_for_errors);
}

void ChatTemplate::set_special_token(const std::string& key, const std::string& value) {
  special_[key] = value;
  find_training_variant();
}

void ChatTemplate::set_kwargs(const ojson& kwargs) {
  LT_CHECK_INPUT(kwargs.is_object(), "chat_template_kwargs must be a JSON object, got ",
                 kwargs.dump());
  check_chat_template_kwargs(kwargs, "option --chat_template_kwargs");
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) kwargs_[it.key()] = it.value();
  find_training_variant();
}

std::string ChatTemplate::assistant_mask_error() const {
  if (has_assistant_mask()) return "";
  return "assistant_only_loss needs the chat template (" + name_ +
         ") to mark assistant text with {% generation %} blocks; it has none and is not one of "
         "the known families (ChatML, Qwen2.5, Qwen3, SmolLM2, Llama-3.x, Gemma 3): pass "
         "--chat_template "
         "FILE.jinja with {% generation %} blocks";
}

// The family training variant: TRL's by identity (the template is a bundled family template byte
// for byte, as TRL's get_training_chat_template compares; Qwen3's variant renders earlier
// assistant turns with think blocks, so probes could not match it), else the one that renders a
// few probe conversations exactly as the template. Either way a conversation gets the variant's
// spans only where both render the same text (render_request). The template renders each probe
// once; one it cannot render rules out every variant, and one that stops at a limit of the
// interpreter (jinja::TemplateLimitError: a runaway template) is reported at once, naming the
// template, instead of being tried again for every variant.
void ChatTemplate::find_training_variant() {
  training_.reset();
  training_name_.clear();
  if (own_generation_ || !template_) return;
  for (const auto& t : jinja::bundled_templates()) {
    if (source_text_ != t.text) continue;
    const std::string want = std::string(t.name) + "_training";
    for (const auto& [name, variant] : training_variants()) {
      if (name != want) continue;
      training_ = variant;
      training_name_ = name;
      return;
    }
  }
  const std::vector<std::vector<ChatMessage>> probes = {
      {{"user", "Hi"}},
      {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello. "}},
      {{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}},
  };
  ChatTemplate probe = *this;
  probe.now_ = now_ ? *now_ : local_now();
  std::vector<std::pair<ChatRequest, std::string>> expected;
  for (const auto& p : probes) {
    for (bool agp : {false, true}) {
      ChatRequest r = request_of(p, agp);
      try {
        std::string text = probe.render_with(*template_, r).text;
        expected.emplace_back(std::move(r), std::move(text));
      } catch (const jinja::TemplateLimitError&) {
        throw;
      } catch (const Error&) {
        return;
      }
    }
  }
  for (const auto& [name, variant] : training_variants()) {
    bool same = true;
    for (const auto& [r, text] : expected) {
      try {
        same = probe.render_with(*variant, r).text == text;
      } catch (const Error&) {
        same = false;
      }
      if (!same) break;
    }
    if (same) {
      training_ = variant;
      training_name_ = name;
      return;
    }
  }
}

RenderedChat ChatTemplate::render_with(const jinja::Template& t, const ChatRequest& r) const {
  ojson ctx = ojson::object();
  ojson messages = ojson::array();
  LT_CHECK_INPUT(r.messages.is_array(), "chat messages must be a JSON list");
  for (const ojson& m : r.messages) {
    if (!m.is_object()) {
      messages.push_back(m);
      continue;
    }
    ojson kept = ojson::object();
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!it.value().is_null()) kept[it.key()] = it.value();
    }
    messages.push_back(std::move(kept));
  }
  ctx["messages"] = std::move(messages);
  ctx["tools"] = r.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = r.add_generation_prompt;
  for (auto it = special_.begin(); it != special_.end(); ++it) ctx[it.key()] = it.value();
  for (auto it = kwargs_.begin(); it != kwargs_.end(); ++it) ctx[it.key()] = it.value();
  for (auto it = r.kwargs.begin(); it != r.kwargs.end(); ++it) ctx[it.key()] = it.value();
  jinja::Rendered out = t.render(jinja::Value::from_json(ctx), now_);
  RenderedChat rc;
  rc.text = std::move(out.text);
  rc.generation_spans = std::move(out.generation_spans);
  return rc;
}

RenderedChat ChatTemplate::render_request(const ChatRequest& r) const {
  LT_CHECK(template_ != nullptr, "ChatTemplate: no template");
  if (own_generation_ || !training_) {
    RenderedChat rc = render_with(*template_, r);
    rc.has_spans = own_generation_;
    if (!own_generation_) rc.generation_spans.clear();
    return rc;
  }
  ChatTemplate pinned = *this;
  if (!pinned.now_) pinned.now_ = local_now();
  RenderedChat rc = pinned.render_with(*template_, r);
  try {
    RenderedChat tr = pinned.render_with(*training_, r);
    if (tr.text == rc.text) {
      rc.generation_spans = std::move(tr.generation_spans);
      rc.has_spans = true;
    }
  } catch (const Error&) {
    // The variant cannot render this conversation (e.g. tool calls): no mask for it.
  }
  return rc;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  ChatRequest r = request_of(messages, add_generation_prompt);
  return render_with(*template_, r).text;
}

RenderedChat ChatTemplate::render_with_spans(const std::vector<ChatMessage>& messages,
                                             bool add_generation_prompt) const {
  return render_request(request_of(messages, add_generation_prompt));
}

ChatEncoding ChatTemplate::encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt) const {
  return encode_request(tok, request_of(messages, add_generation_prompt));
}

ChatEncoding ChatTemplate::encode_request(const Tokenizer& tok, const ChatRequest& request) const {
  const RenderedChat r = render_request(request);
  EncodingWithOffsets enc = tok.encode_with_offsets(r.text, /*add_special_tokens=*/false);
  ChatEncoding out;
  if (r.has_spans) {
    out.assistant_mask.assign(enc.ids.size(), 0);
    // transformers: tokens from char_to_token(span start) to char_to_token(span end - 1), where
    // char_to_token is the first token whose range holds the character.
    auto token_at = [&](size_t byte, size_t from) -> std::optional<size_t> {
      for (size_t t = from; t < enc.offsets.size(); ++t) {
        if (enc.offsets[t].first <= byte && byte < enc.offsets[t].second) return t;
      }
      return std::nullopt;
    };
    size_t search_from = 0;
    for (const auto& [b, e] : r.generation_spans) {
      if (e <= b) continue;
      std::optional<size_t> start = token_at(b, search_from);
      if (!start) start = token_at(b, 0);
      if (!start) break;  // as transformers: the span is past the tokens
      const size_t last_char = unicode::previous_code_point_start(r.text, e);
      std::optional<size_t> end = token_at(last_char, *start);
      if (!end) end = token_at(last_char, 0);
      // transformers' `end_token + 1 if end_token else len(ids)`: a missing (or 0) end token
      // marks to the end.
      const size_t stop = end && *end != 0 ? *end + 1 : enc.ids.size();
      for (size_t t = *start; t < stop; ++t) out.assistant_mask[t] = 1;
      search_from = *start;
    }
  }
  out.ids = std::move(enc.ids);
  return out;
}

}  // namespace leantune
