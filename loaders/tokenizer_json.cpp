// Reading tokenizer.json: a SAX pass that stores the large vocab and merges flat, then the
// Tokenizer::Impl::load_* steps that turn each section (model, added_tokens, normalizer,
// pre_tokenizer, post_processor, decoder) into pipeline steps, rejecting unsupported features
// with Error(kInput) naming the file.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "loaders/tokenizer_impl.h"

namespace leantune {
namespace tokenizer_detail {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

class TokenizerJsonSax {
 public:
  explicit TokenizerJsonSax(ParsedTokenizerJson& out) : out_(out) {}

  bool null() { return value(json()); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(json::number_integer_t v) {
    if (mode_ == Mode::kVocab) return vocab_id(v);
    return value(v);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == Mode::kVocab) {
      return vocab_id(
          v > static_cast<json::number_unsigned_t>(INT32_MAX) ? -1 : static_cast<int64_t>(v));
    }
    return value(v);
  }
  bool number_float(json::number_float_t v, const std::string&) {
    if (mode_ == Mode::kVocab)
      return fail("model.vocab: the id of '" + key_ + "' is not an integer");
    return value(v);
  }
  bool string(json::string_t& v) {
    if (mode_ == Mode::kVocab)
      return fail("model.vocab: the id of '" + key_ + "' is not an integer");
    if (mode_ == Mode::kMerges) return merge_string(v);
    return value(std::move(v));
  }
  bool binary(json::binary_t& v) { return value(json::binary(v)); }

  bool start_object(size_t) {
    if (mode_ != Mode::kDom) return fail(where() + ": unexpected object");
    if (at_model_key("vocab")) {
      mode_ = Mode::kVocab;
      out_.has_vocab = true;
      return value(json::object());
    }
    return open(json::object());
  }
  bool key(json::string_t& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool start_array(size_t) {
    if (mode_ == Mode::kVocab) return fail(where() + ": unexpected array");
    if (mode_ == Mode::kMerges) {
      if (in_pair_) return fail(where() + ": a merge must be \"a b\" or [\"a\", \"b\"]");
      in_pair_ = true;
      pair_.clear();
      return true;
    }
    if (at_model_key("merges")) {
      mode_ = Mode::kMerges;
      out_.has_merges = true;
      return value(json::array());
    }
    return open(json::array());
  }
  bool end_array() {
    if (mode_ == Mode::kMerges) {
      if (!in_pair_) {
        mode_ = Mode::kDom;
        return true;
      }
      in_pair_ = false;
      if (pair_.size() != 2) return fail(where() + ": a merge must be \"a b\" or [\"a\", \"b\"]");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      return true;
    }
    return close();
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    return fail(std::string("invalid JSON: ") + e.what());
  }

  const std::string& error() const { return error_; }

 private:
  enum class Mode { kDom, kVocab, kMerges };

  std::string where() const {
    return mode_ == Mode::kVocab ? "model.vocab"
                                 : "model.merges[" + std::to_string(out_.merges.size()) + "]";
  }
  bool fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return false;
  }
  // The next container opens under key `k` of the root's "model" object.
  bool at_model_key(const char* k) const {
    return stack_.size() == 2 && stack_[1]->is_object() && key_ == k && path_.size() == 2 &&
           path_[1] == "model";
  }
  bool vocab_id(int64_t v) {
    if (v < 0 || v > INT32_MAX)
      return fail("model.vocab: the id of '" + key_ + "' is out of range");
    out_.vocab.insert(key_, static_cast<uint64_t>(v));
    return true;
  }
  bool merge_string(std::string& v) {
    if (in_pair_) {
      pair_.push_back(std::move(v));
      return true;
    }
    const size_t sp = v.find(' ');
    if (sp == std::string::npos) return fail(where() + " '" + v + "' is not of the form 'a b'");
    out_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
    return true;
  }
  json* insert(json&& v) {
    if (stack_.empty()) {
      out_.root = std::move(v);
      return &out_.root;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json&& v) {
    insert(std::move(v));
    return true;
  }
  bool open(json&& v) {
    const std::string k = !stack_.empty() && stack_.back()->is_object() ? key_ : std::string();
    stack_.push_back(insert(std::move(v)));
    path_.push_back(k);
    return true;
  }
  bool close() {
    stack_.pop_back();
    path_.pop_back();
    return true;
  }

  ParsedTokenizerJson& out_;
  std::vector<json*> stack_;
  std::vector<std::string> path_;  // the key each open container sits under
  std::string key_;
  Mode mode_ = Mode::kDom;
  bool in_pair_ = false;
  std::vector<std::string> pair_;
  std::string error_;
};

}  // namespace

ParsedTokenizerJson parse_tokenizer_json(std::string_view text, const std::string& source) {
  ParsedTokenizerJson out;
  TokenizerJsonSax sax(out);
  const bool ok = json::sax_parse(text.begin(), text.end(), &sax);
  if (!ok || !sax.error().empty()) {
    LT_THROW(ErrorKind::kInput, source, ": ", sax.error().empty() ? "invalid JSON" : sax.error());
  }
  return out;
}

const json& member(const json& j, const char* key) {
  static const json kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

bool json_bool(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->get<bool>();
}

std::optional<std::string> config_token(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace tokenizer_detail

using namespace tokenizer_detail;

void Tokenizer::Impl::load_model(const json& model, ParsedTokenizerJson& parsed) {
  LT_CHECK_INPUT(model.is_object(), source, ": \"model\" is missing");
  const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
  LT_CHECK_INPUT(type == "BPE", source, ": model type '", type,
                 "' is not supported (only byte-level BPE tokenizers are)");
  LT_CHECK_INPUT(!json_bool(model, "byte_fallback", false), source,
                 ": BPE byte_fallback is not supported");
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    LT_CHECK_INPUT(model["dropout"].get<double>() == 0.0, source, ": BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null()) {
      LT_CHECK_INPUT(model[key].get<std::string>().empty(), source, ": BPE ", key,
                     " is not supported");
    }
  }
  LT_CHECK_INPUT(parsed.has_vocab, source, ": model.vocab must be an object");
  BpeModel::Options options;
  options.ignore_merges = json_bool(model, "ignore_merges", false);
  options.fuse_unk = json_bool(model, "fuse_unk", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    options.unk_token = model["unk_token"].get<std::string>();
  }
  bpe = std::make_unique<BpeModel>(std::move(parsed.vocab), parsed.merges, options, source);
  parsed.merges.clear();
}

void Tokenizer::Impl::load_added(const json& list) {
  if (list.is_null()) return;
  LT_CHECK_INPUT(list.is_array(), source, ": added_tokens must be an array");
  for (const json& t : list) {
    AddedToken a;
    LT_CHECK_INPUT(t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                       t["content"].is_string(),
                   source, ": an added token needs an integer id and a string content");
    const auto id = t["id"].get<int64_t>();
    a.content = t["content"].get<std::string>();
    LT_CHECK_INPUT(id >= 0 && id <= INT32_MAX, source, ": added token '", a.content, "' has id ",
                   id, " outside [0, 2^31)");
    a.id = static_cast<int32_t>(id);
    a.special = json_bool(t, "special", false);
    a.lstrip = json_bool(t, "lstrip", false);
    a.rstrip = json_bool(t, "rstrip", false);
    a.single_word = json_bool(t, "single_word", false);
    a.normalized = json_bool(t, "normalized", !a.special);
    if (a.content.empty()) continue;
    added.push_back(std::move(a));
  }
}

void Tokenizer::Impl::load_normalizer(const json& j) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) load_normalizer(n);
  } else if (type == "NFC") {
    normalizers.push_back({NormStep::Kind::kForm, unicode::NormalForm::kNFC});
  } else if (type == "NFD") {
    normalizers.push_back({NormStep::Kind::kForm, unicode::NormalForm::kNFD});
  } else if (type == "NFKC") {
    normalizers.push_back({NormStep::Kind::kForm, unicode::NormalForm::kNFKC});
  } else if (type == "NFKD") {
    normalizers.push_back({NormStep::Kind::kForm, unicode::NormalForm::kNFKD});
  } else if (type == "Lowercase") {
    normalizers.push_back({NormStep::Kind::kLowercase, unicode::NormalForm::kNFC});
  } else {
    LT_THROW(ErrorKind::kInput, source, ": normalizer '", type, "' is not supported");
  }
}

void Tokenizer::Impl::load_pretokenizer(const json& j) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) load_pretokenizer(p);
  } else if (type == "Split") {
    PreTokStep s;
    s.kind = PreTokStep::Kind::kSplit;
    const json& pat = j.at("pattern");
    if (pat.contains("Regex")) {
      s.regex = std::make_unique<Regex>(pat["Regex"].get<std::string>(), false, source);
    } else if (pat.contains("String")) {
      s.regex = std::make_unique<Regex>(pat["String"].get<std::string>(), true, source);
    } else {
      LT_THROW(ErrorKind::kInput, source, ": Split pattern must be {\"Regex\"} or {\"String\"}");
    }
    const std::string b = j.value("behavior", "Isolated");
    if (b == "Removed") {
      s.behavior = SplitBehavior::kRemoved;
    } else if (b == "Isolated") {
      s.behavior = SplitBehavior::kIsolated;
    } else if (b == "MergedWithPrevious") {
      s.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (b == "MergedWithNext") {
      s.behavior = SplitBehavior::kMergedWithNext;
    } else if (b == "Contiguous") {
      s.behavior = SplitBehavior::kContiguous;
    } else {
      LT_THROW(ErrorKind::kInput, source, ": Split behavior '", b, "' is not supported");
    }
    s.invert = json_bool(j, "invert", false);
    pretokenizers.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    PreTokStep s;
    s.kind = PreTokStep::Kind::kByteLevel;
    s.add_prefix_space = json_bool(j, "add_prefix_space", true);
    if (json_bool(j, "use_regex", true)) {
      s.regex = std::make_unique<Regex>(kGpt2Pattern, false, source);
    }
    // Without prefix or regex the step only maps bytes to characters, which the BPE model
    // does implicitly by working on raw bytes.
    if (s.add_prefix_space || s.regex) pretokenizers.push_back(std::move(s));
  } else if (type == "Digits") {
    PreTokStep s;
    s.kind = PreTokStep::Kind::kDigits;
    s.individual_digits = json_bool(j, "individual_digits", false);
    pretokenizers.push_back(std::move(s));
  } else {
    LT_THROW(ErrorKind::kInput, source, ": pre-tokenizer '", type, "' is not supported");
  }
}

void Tokenizer::Impl::load_post_processor(const json& j) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& p : j.at("processors")) load_post_processor(p);
  } else if (type == "ByteLevel") {
    // Only trims offsets; ids are unchanged.
  } else if (type == "TemplateProcessing") {
    LT_CHECK_INPUT(!has_template, source, ": more than one TemplateProcessing");
    has_template = true;
    const json& specials = j.value("special_tokens", json::object());
    for (const json& item : j.at("single")) {
      TemplateItem t;
      if (item.contains("Sequence")) {
        t.is_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].at("id").get<std::string>();
        LT_CHECK_INPUT(specials.contains(name), source, ": TemplateProcessing special token '",
                       name, "' is not in special_tokens");
        t.special_ids = specials[name].at("ids").get<std::vector<int32_t>>();
      } else {
        LT_THROW(ErrorKind::kInput, source, ": unknown TemplateProcessing item ", item.dump());
      }
      template_single.push_back(std::move(t));
    }
  } else {
    LT_THROW(ErrorKind::kInput, source, ": post-processor '", type, "' is not supported");
  }
}

void Tokenizer::Impl::load_decoder(const json& j) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& d : j.at("decoders")) load_decoder(d);
  } else if (type == "ByteLevel") {
    LT_CHECK_INPUT(decoder == DecoderKind::kNone, source, ": more than one ByteLevel decoder");
    decoder = DecoderKind::kByteLevel;
  } else {
    LT_THROW(ErrorKind::kInput, source, ": decoder '", type, "' is not supported");
  }
}

void Tokenizer::Impl::finish() {
  int64_t max_id = bpe->max_id();
  for (const auto& a : added) max_id = std::max<int64_t>(max_id, a.id);
  // Ids index dense tables; a corrupt file must not make us allocate gigabytes.
  constexpr int64_t kMaxIds = int64_t{1} << 26;
  LT_CHECK_INPUT(max_id < kMaxIds, source, ": token id ", max_id, " is implausibly large (limit ",
                 kMaxIds, ")");
  vocab_size = max_id + 1;
  id_to_token.assign(vocab_size, std::string());
  special.assign(vocab_size, 0);
  bpe->vocab().for_each([&](std::string_view token, uint64_t id) { id_to_token[id] = token; });
  std::vector<int32_t> special_ids;
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    id_to_token[a.id] = a.content;
    added_by_content[a.content] = a.id;
    if (a.special) special_ids.push_back(a.id);
    if (a.normalized) {
      std::string norm;
      normalized_trie.add(normalize(a.content, norm) ? std::string_view(norm) : a.content,
                          static_cast<int32_t>(i));
    } else {
      raw_trie.add(a.content, static_cast<int32_t>(i));
    }
  }
  // tokenizers skips by token string: every id whose string is a special token's.
  StringIdMap special_contents;
  for (int32_t s : special_ids) special_contents.emplace(id_to_token[s], s);
  for (int64_t id = 0; id < vocab_size; ++id) {
    if (special_contents.count(id_to_token[id]) != 0) special[id] = 1;
  }
  decoded.assign(vocab_size, std::string());
  for (int64_t id = 0; id < vocab_size; ++id) {
    if (decoder == DecoderKind::kByteLevel) {
      if (!unicode::byte_level_to_bytes(id_to_token[id], decoded[id])) {
        decoded[id] = id_to_token[id];
      }
    } else {
      decoded[id] = id_to_token[id];
    }
  }
}

}  // namespace leantune
