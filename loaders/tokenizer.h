// Hugging Face tokenizer.json, byte-level BPE family (Qwen2/Qwen2.5, Llama-3, GPT-2, SmolLM2).
//
// Contract: for the tokenizer files of these families, encode() returns exactly the ids of
// Hugging Face `tokenizers` (Tokenizer.encode(text, add_special_tokens).ids) and decode()
// exactly its Tokenizer.decode(ids, skip_special_tokens). The pipeline is the one of
// tokenizers: added tokens (longest leftmost match, lstrip/rstrip/single_word/normalized flags)
// -> normalizer (NFC/NFD/NFKC/NFKD, Lowercase, Replace, Sequence, or none) -> pre-tokenizer
// (Split with a PCRE2 regex, ByteLevel, Digits, Sequence) -> BPE (merge ranks, ignore_merges)
// -> post-processor (TemplateProcessing, ByteLevel, Sequence). Features outside this set
// (Unigram/WordPiece models, byte_fallback, dropout, ...) are rejected at load with an
// Error of kind kInput that names the file and the feature.
//
// Invalid UTF-8: tokenizers cannot receive it (Python str and Rust &str are valid UTF-8 by
// construction; a Python pipeline fails at bytes.decode() unless it asks for errors='replace').
// encode() therefore throws Error(kInput) naming the byte offset of the first invalid
// sequence, instead of silently changing data; callers that want Python's lossy behaviour
// call utf8_replace_invalid() first. decode() may produce invalid UTF-8 from a partial
// sequence of byte tokens; like tokenizers (String::from_utf8_lossy) it replaces each maximal
// invalid subpart with U+FFFD.
//
// Known divergence: the regex classes come from PCRE2's Unicode tables (10.42: Unicode 14),
// tokenizers' from Oniguruma's (newer). Code points assigned after Unicode 14 (e.g. CJK
// Extension H, U+31350..U+323AF) are not \p{L}/\p{N} here and may split differently.
// decode() throws Error(kInput) for ids outside the vocab where tokenizers skips them silently.
//
// Thread safety: a loaded Tokenizer is immutable apart from an internal, locked BPE cache;
// encode/decode may be called from several threads. set_chat_template() is not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace leantune {

class ChatTemplate;

// Ids with the byte range [begin, end) of the input text that each token came from. Tokens
// added by the post-processor (e.g. Llama-3's BOS) have an empty range at 0.
struct EncodingWithOffsets {
  std::vector<int32_t> ids;
  std::vector<std::pair<uint32_t, uint32_t>> offsets;
};

class Tokenizer {
 public:
  // A folder holding tokenizer.json (+ tokenizer_config.json, special_tokens_map.json), or a
  // tokenizer.json path (its folder is searched for the other two).
  static std::shared_ptr<Tokenizer> load(const std::string& path);
  // From file contents; the config texts may be empty. source names the origin in errors.
  static std::shared_ptr<Tokenizer> from_json(std::string_view tokenizer_json,
                                              std::string_view tokenizer_config_json = {},
                                              std::string_view special_tokens_map_json = {},
                                              const std::string& source = "<memory>");

  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Throws Error(kInput) when text is not valid UTF-8 (see above).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  EncodingWithOffsets encode_with_offsets(std::string_view text,
                                          bool add_special_tokens = false) const;
  // Ids outside [0, vocab_size()) throw Error(kInput).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // base vocab + added tokens (max id + 1)
  // Token strings as they appear in tokenizer.json (byte-level form, e.g. "Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" for an id without a token
  // From tokenizer_config.json / special_tokens_map.json (nullopt where not declared).
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  std::optional<std::string> bos_token() const;
  std::optional<std::string> eos_token() const;
  bool is_special(int32_t id) const;

  // The chat template found in tokenizer_config.json. Throws Error(kInput) suggesting
  // --chat_template chatml|llama3 if it is absent or unrecognised.
  const ChatTemplate& chat_template() const;
  // The named special tokens a chat template sees (bos/eos/unk/pad_token that are set).
  std::vector<std::pair<std::string, std::string>> special_tokens() const;
  bool has_chat_template() const;
  // Overrides the template by name ("chatml" | "llama3"); Error(kInput) otherwise.
  void set_chat_template(const std::string& name);
  // Extra template variables (TRL's chat_template_kwargs); Error(kInput) without a template.
  void set_chat_template_kwargs(const nlohmann::ordered_json& kwargs);
  // The jinja source from tokenizer_config.json ("" if none).
  const std::string& chat_template_source() const;

  const std::string& source_path() const;

 private:
  std::unique_ptr<Impl> impl_;
};

// Replaces each maximal invalid UTF-8 subpart with U+FFFD, exactly as Python's
// bytes.decode('utf-8', errors='replace') and Rust's String::from_utf8_lossy do.
std::string utf8_replace_invalid(std::string_view bytes);
// Byte offset of the first invalid UTF-8 sequence, or std::string_view::npos if valid.
size_t utf8_find_invalid(std::string_view bytes);

}  // namespace leantune
