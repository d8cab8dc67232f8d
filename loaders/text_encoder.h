// The tokenizer operations the data pipeline needs, behind one small interface so that the
// pipeline is testable with a hand-made encoder and runs on the real Tokenizer + ChatTemplate
// (loaders/tokenizer.h, loaders/chat_template.h) through make_text_encoder().
//
// Contract of an implementation:
//   encode(text, add_special_tokens)   tokenizer(text) ids; add_special_tokens as in HF
//   encode_chat(messages, add_gen)     apply_chat_template(tokenize=True) ids + TRL assistant mask
//   render_chat(messages, add_gen)     apply_chat_template(tokenize=False)
//   eos_token()/eos_token_id()         the tokenizer's eos (text and id)
//   pad_token_id()                     pad token, else eos (TRL's fallback)
// Errors about the input (invalid role, text the tokenizer refuses) throw Error(kInput); the
// pipeline turns them into a bad line with the file and line.
//
// API
//   std::unique_ptr<TextEncoder> make_text_encoder(std::shared_ptr<const Tokenizer> tok,
//                                                  const std::string& chat_template = "")
//   (chat_template: "" = the tokenizer's own; else a ChatTemplate::from_name name or .jinja path)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loaders/dataset.h"

namespace leantune {

class Tokenizer;

struct ChatIds {
  std::vector<int32_t> ids;
  std::vector<uint8_t> assistant_mask;  // empty when the template gives no mask for it
};

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual ChatIds encode_chat(const std::vector<Message>& messages,
                              bool add_generation_prompt) const = 0;
  virtual std::string render_chat(const std::vector<Message>& messages,
                                  bool add_generation_prompt) const = 0;
  virtual std::string eos_token() const = 0;
  virtual int32_t eos_token_id() const = 0;
  virtual int32_t pad_token_id() const = 0;
  virtual int64_t vocab_size() const = 0;
  // "" when encode_chat() gives assistant masks; else why not (one line, for refusing
  // assistant_only_loss before any data is read).
  virtual std::string assistant_mask_error() const { return ""; }
};

// Throws Error(kInput) when the tokenizer has no eos token, or when chat_template names no
// known template.
std::unique_ptr<TextEncoder> make_text_encoder(std::shared_ptr<const Tokenizer> tokenizer,
                                               const std::string& chat_template = "");

}  // namespace leantune
