// Internal to the tokenizer (tokenizer*.cpp): the pipeline steps read from tokenizer.json and
// Tokenizer::Impl, which tokenizer_json.cpp fills (load_*) and tokenizer_pipeline.cpp runs
// (encode). See tokenizer.h for the contract.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loaders/bpe.h"
#include "loaders/chat_template.h"
#include "loaders/tokenizer.h"
#include "loaders/tokenizer_added.h"
#include "loaders/tokenizer_regex.h"
#include "loaders/unicode.h"

namespace leantune {
namespace tokenizer_detail {

using nlohmann::json;

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct NormStep {
  enum class Kind { kForm, kLowercase } kind;
  unicode::NormalForm form = unicode::NormalForm::kNFC;
};

struct PreTokStep {
  enum class Kind { kSplit, kByteLevel, kDigits } kind = Kind::kSplit;
  std::unique_ptr<Regex> regex;  // kSplit; kByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
  bool individual_digits = false;
};

struct TemplateItem {
  bool is_sequence = false;          // the input sequence "A"
  std::vector<int32_t> special_ids;  // a SpecialToken's ids
};

// GPT-2's split regex, used by the ByteLevel pre-tokenizer when use_regex is true.
extern const char* const kGpt2Pattern;

// tokenizer.json is mostly model.vocab and model.merges (hundreds of thousands of entries): a SAX
// pass stores those two straight into flat containers and builds a DOM for the rest only.
struct ParsedTokenizerJson {
  json root;
  FlatStringMap vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_vocab = false;
  bool has_merges = false;
};

ParsedTokenizerJson parse_tokenizer_json(std::string_view text, const std::string& source);
// j[key], or a null value when absent.
const json& member(const json& j, const char* key);
// j[key] as a bool; dflt when absent or null.
bool json_bool(const json& j, const char* key, bool dflt);
// A token given in tokenizer_config.json / special_tokens_map.json: "text" or {"content": ...}.
std::optional<std::string> config_token(const json& j, const char* key);

}  // namespace tokenizer_detail

struct Tokenizer::Impl {
  using json = nlohmann::json;
  using AddedToken = tokenizer_detail::AddedToken;
  using TokenTrie = tokenizer_detail::TokenTrie;
  using NormStep = tokenizer_detail::NormStep;
  using PreTokStep = tokenizer_detail::PreTokStep;
  using TemplateItem = tokenizer_detail::TemplateItem;
  using ParsedTokenizerJson = tokenizer_detail::ParsedTokenizerJson;

  std::string source;
  std::unique_ptr<BpeModel> bpe;
  std::vector<AddedToken> added;
  TokenTrie raw_trie;         // added tokens with normalized=false, matched on the input
  TokenTrie normalized_trie;  // normalized=true, matched on normalized pieces
  std::vector<NormStep> normalizers;
  std::vector<PreTokStep> pretokenizers;
  bool has_template = false;
  std::vector<TemplateItem> template_single;
  enum class DecoderKind { kNone, kByteLevel } decoder = DecoderKind::kNone;

  std::vector<std::string> id_to_token;  // token strings as in tokenizer.json ("" = none)
  std::vector<std::string> decoded;      // bytes the decoder produces for each id
  std::vector<uint8_t> special;          // per id
  StringIdMap added_by_content;
  int64_t vocab_size = 0;

  std::optional<std::string> bos, eos, pad, unk;
  std::string chat_source;
  std::optional<ChatTemplate> chat;
  std::string chat_error;

  // The special tokens a chat template sees (transformers' special_tokens_map).
  std::vector<std::pair<std::string, std::string>> special_tokens() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto [key, v] : {std::pair{"bos_token", &bos}, std::pair{"eos_token", &eos},
                          std::pair{"unk_token", &unk}, std::pair{"pad_token", &pad}}) {
      if (*v) out.emplace_back(key, **v);
    }
    return out;
  }
  void give_special_tokens(ChatTemplate& t) const {
    for (const auto& [key, value] : special_tokens()) t.set_special_token(key, value);
  }

  void load_model(const json& model, ParsedTokenizerJson& parsed);
  void load_added(const json& list);
  void load_normalizer(const json& j);
  void load_pretokenizer(const json& j);
  void load_post_processor(const json& j);
  void load_decoder(const json& j);
  void finish();

  // Encoding.
  struct Output {
    std::vector<int32_t>* ids;
    std::vector<std::pair<uint32_t, uint32_t>>* offsets;  // null when not wanted
  };
  // How normalized bytes of a text segment map back to the input (offsets mode only).
  struct SegMap {
    enum class Kind { kLinear, kTable, kCoarse } kind = Kind::kLinear;
    uint32_t ob = 0, oe = 0;                           // the segment's input range
    std::vector<std::pair<uint32_t, uint32_t>> table;  // per normalized byte
  };
  struct Piece {
    std::string_view text;
    int64_t norm_base;  // normalized position of text[0] (may precede nb for a prefix space)
    uint32_t nb, ne;    // normalized range the piece may map to
  };
  struct Work {
    std::deque<std::string> arena;
    std::vector<uint32_t> lengths;
  };

  void encode(std::string_view text, bool add_special, Output out) const;
  void encode_segment(std::string_view text, uint32_t ob, Output out, Work& work) const;
  void run_pretokenizers(size_t step, const Piece& piece, const SegMap* map, Output out,
                         Work& work) const;
  void emit_word(const Piece& piece, const SegMap* map, Output out, Work& work) const;
  std::pair<uint32_t, uint32_t> to_input(const SegMap& map, int64_t nb, int64_t ne, uint32_t lo,
                                         uint32_t hi) const;
  bool normalize(std::string_view in, std::string& out) const;
  void build_table(std::string_view in, uint32_t ob, SegMap& map) const;
  // HF AddedVocabulary::find_matches: calls on_text(b, e) and on_token(id, b, e) in order.
  void find_added(const TokenTrie& trie, std::string_view s,
                  const std::function<void(size_t, size_t)>& on_text,
                  const std::function<void(int32_t, size_t, size_t)>& on_token) const;
};

}  // namespace leantune
