// TextEncoder over the native Tokenizer and ChatTemplate (see text_encoder.h).
#include "loaders/text_encoder.h"

#include <optional>

#include "engine/check.h"
#include "loaders/chat_template.h"
#include "loaders/tokenizer.h"

namespace leantune {

namespace {

std::vector<ChatMessage> to_chat(const std::vector<Message>& messages) {
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (const Message& m : messages) out.push_back({m.role, m.content});
  return out;
}

class TokenizerEncoder final : public TextEncoder {
 public:
  TokenizerEncoder(std::shared_ptr<const Tokenizer> tok, const std::string& chat_template)
      : tok_(std::move(tok)) {
    const auto eos = tok_->eos_token();
    const auto eos_id = tok_->eos_token_id();
    LT_CHECK_INPUT(eos.has_value() && eos_id.has_value(), tok_->source_path(),
                   ": the tokenizer declares no eos token (tokenizer_config.json eos_token)");
    eos_ = *eos;
    eos_id_ = *eos_id;
    pad_id_ = tok_->pad_token_id().value_or(eos_id_);
    if (!chat_template.empty()) {
      override_ = ChatTemplate::from_name(chat_template);
      for (const auto& [key, value] : tok_->special_tokens()) {
        override_->set_special_token(key, value);
      }
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    return tok_->encode(text, add_special_tokens);
  }
  ChatIds encode_chat(const std::vector<Message>& messages,
                      bool add_generation_prompt) const override {
    ChatEncoding e = chat().encode(*tok_, to_chat(messages), add_generation_prompt);
    return {std::move(e.ids), std::move(e.assistant_mask)};
  }
  std::string render_chat(const std::vector<Message>& messages,
                          bool add_generation_prompt) const override {
    return chat().render(to_chat(messages), add_generation_prompt);
  }
  std::string eos_token() const override { return eos_; }
  int32_t eos_token_id() const override { return eos_id_; }
  int32_t pad_token_id() const override { return pad_id_; }
  int64_t vocab_size() const override { return tok_->vocab_size(); }
  std::string assistant_mask_error() const override { return chat().assistant_mask_error(); }

 private:
  const ChatTemplate& chat() const { return override_ ? *override_ : tok_->chat_template(); }

  std::shared_ptr<const Tokenizer> tok_;
  std::optional<ChatTemplate> override_;
  std::string eos_;
  int32_t eos_id_ = 0;
  int32_t pad_id_ = 0;
};

}  // namespace

std::unique_ptr<TextEncoder> make_text_encoder(std::shared_ptr<const Tokenizer> tokenizer,
                                               const std::string& chat_template) {
  LT_CHECK(tokenizer != nullptr, "make_text_encoder: null tokenizer");
  return std::make_unique<TokenizerEncoder>(std::move(tokenizer), chat_template);
}

}  // namespace leantune
