// tokenizer.json loading and the encode/decode pipeline of Hugging Face tokenizers (see
// tokenizer.h): added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor.
#include "loaders/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/check.h"
#include "loaders/bpe.h"
#include "loaders/chat_template.h"
#include "loaders/unicode.h"

namespace leantune {

using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// PCRE2 regex (UTF + UCP, JIT-compiled), with Rust/Oniguruma find_iter semantics.

// tokenizers compiles its patterns with Oniguruma, whose \s is Unicode White_Space. PCRE2's \s
// with UCP also matches U+180E (\h), so \s and \S are spelled out as White_Space classes
// (\S inside a character class is left alone: no tokenizer pattern uses it).
std::string oniguruma_to_pcre2(const std::string& p) {
  static const std::string kSpace = "\\t-\\r\\x{85}\\p{Z}";
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += in_class ? kSpace : "[" + kSpace + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + kSpace + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t close = p.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(p, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& source_pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
    const std::string pattern = literal ? source_pattern : oniguruma_to_pcre2(source_pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                          &err, &err_offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      LT_THROW(ErrorKind::kInput, where, ": cannot compile regex '", source_pattern, "' (as '",
               pattern, "') at offset ", err_offset, ": ", reinterpret_cast<const char*>(msg));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(begin, end) for each non-empty, non-overlapping match, left to right.
  template <typename F>
  void for_each_match(std::string_view s, F&& fn) const {
    ThreadState& ts = thread_state();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t start = 0;
    while (start < s.size()) {
      int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), start, 0, ts.data, ts.context)
                    : pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, ts.data,
                                  ts.context);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // Pathologically long runs: the interpreter keeps its backtracking state on the heap.
        rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, ts.data, ts.context);
      }
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        LT_THROW(ErrorKind::kInternal, "tokenizer regex match failed at byte ", start, ": ",
                 reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.data);
      const size_t b = ov[0], e = ov[1];
      if (e <= b) {
        // Empty matches split nothing; step over one character.
        size_t i = std::max(start, b);
        if (i >= s.size()) return;
        unicode::next_code_point(s, i);
        start = i;
        continue;
      }
      fn(b, e);
      start = e;
    }
  }

 private:
  struct ThreadState {
    pcre2_match_data* data = nullptr;
    pcre2_match_context* context = nullptr;
    pcre2_jit_stack* stack = nullptr;
    ThreadState() {
      data = pcre2_match_data_create(1, nullptr);
      context = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
      if (!data || !context || !stack) throw std::bad_alloc();
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~ThreadState() {
      pcre2_jit_stack_free(stack);
      pcre2_match_context_free(context);
      pcre2_match_data_free(data);
    }
  };
  static ThreadState& thread_state() {
    thread_local ThreadState ts;
    return ts;
  }

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ---------------------------------------------------------------------------------------------
// Added tokens: a byte trie with leftmost-longest search (tokenizers uses Aho-Corasick with
// MatchKind::LeftmostLongest).

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class TokenTrie {
 public:
  bool empty() const { return nodes_.size() == 1; }
  void add(std::string_view s, int32_t token_index) {
    if (s.empty()) return;
    int32_t node = 0;
    for (unsigned char c : s) {
      int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[node].kids.emplace_back(c, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[node].token = token_index;
    if (!first_[static_cast<unsigned char>(s[0])]) {
      first_[static_cast<unsigned char>(s[0])] = true;
      ++num_first_;
      single_first_ = s[0];
    }
  }
  // The leftmost-longest match starting at or after `from`.
  bool find(std::string_view text, size_t from, size_t& b, size_t& e, int32_t& token) const {
    const size_t n = text.size();
    size_t pos = from;
    while (pos < n) {
      if (num_first_ == 1) {
        const void* p = std::memchr(text.data() + pos, single_first_, n - pos);
        if (!p) return false;
        pos = static_cast<const char*>(p) - text.data();
      } else if (!first_[static_cast<unsigned char>(text[pos])]) {
        ++pos;
        continue;
      }
      int32_t node = 0;
      int32_t best = -1;
      size_t best_end = 0;
      for (size_t i = pos; i < n; ++i) {
        node = child(node, static_cast<unsigned char>(text[i]));
        if (node < 0) break;
        if (nodes_[node].token >= 0) {
          best = nodes_[node].token;
          best_end = i + 1;
        }
      }
      if (best >= 0) {
        b = pos;
        e = best_end;
        token = best;
        return true;
      }
      ++pos;
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> kids;
    int32_t token = -1;
  };
  int32_t child(int32_t node, unsigned char c) const {
    for (const auto& [k, v] : nodes_[node].kids) {
      if (k == c) return v;
    }
    return -1;
  }
  std::vector<Node> nodes_{1};
  bool first_[256] = {};
  int num_first_ = 0;
  char single_first_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Pipeline steps.

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

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  LT_CHECK_INPUT(f.good(), "cannot open ", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  LT_CHECK_INPUT(!f.bad(), "cannot read ", p.string());
  return ss.str();
}

json parse_json(std::string_view text, const std::string& source) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    LT_THROW(ErrorKind::kInput, source, ": invalid JSON: ", e.what());
  }
}

// tokenizer.json is mostly model.vocab and model.merges (hundreds of thousands of entries): a SAX
// pass stores those two straight into flat containers and builds a DOM for the rest only.
struct ParsedTokenizerJson {
  json root;
  FlatStringMap vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_vocab = false;
  bool has_merges = false;
};

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

// A token given in tokenizer_config.json / special_tokens_map.json: "text" or {"content": ...}.
std::optional<std::string> config_token(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
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

bool Tokenizer::Impl::normalize(std::string_view in, std::string& out) const {
  bool changed = false;
  std::string tmp;
  for (const NormStep& step : normalizers) {
    const std::string_view cur = changed ? std::string_view(out) : in;
    if (step.kind == NormStep::Kind::kForm) {
      if (unicode::normalize(cur, step.form, tmp)) {
        out.swap(tmp);
        changed = true;
      }
    } else {
      std::string lower = unicode::to_lower(cur);
      if (lower != cur) {
        out.swap(lower);
        changed = true;
      }
    }
  }
  return changed;
}

void Tokenizer::Impl::build_table(std::string_view in, uint32_t ob, SegMap& map) const {
  // Every normalizer supported here maps a chunk that starts at an ASCII character
  // independently of its neighbours (ASCII characters have combining class 0 and are never
  // the second element of a composition), so normalizing chunk by chunk aligns the output: an
  // unchanged chunk maps byte for byte, a changed one maps as a whole.
  map.kind = SegMap::Kind::kTable;
  map.table.clear();
  size_t start = 0;
  std::string norm;
  while (start < in.size()) {
    size_t end = start + 1;
    while (end < in.size() && static_cast<unsigned char>(in[end]) >= 0x80) ++end;
    const std::string_view chunk = in.substr(start, end - start);
    const uint32_t cb = ob + static_cast<uint32_t>(start);
    const uint32_t ce = ob + static_cast<uint32_t>(end);
    if (normalize(chunk, norm)) {
      for (size_t k = 0; k < norm.size(); ++k) map.table.emplace_back(cb, ce);
    } else {
      for (size_t k = 0; k < chunk.size(); ++k) {
        map.table.emplace_back(cb + static_cast<uint32_t>(k), cb + static_cast<uint32_t>(k) + 1);
      }
    }
    start = end;
  }
}

std::pair<uint32_t, uint32_t> Tokenizer::Impl::to_input(const SegMap& map, int64_t nb, int64_t ne,
                                                        uint32_t lo, uint32_t hi) const {
  nb = std::clamp<int64_t>(nb, lo, hi);
  ne = std::clamp<int64_t>(ne, nb, hi);
  switch (map.kind) {
    case SegMap::Kind::kLinear:
      return {map.ob + static_cast<uint32_t>(nb), map.ob + static_cast<uint32_t>(ne)};
    case SegMap::Kind::kTable: {
      if (map.table.empty()) return {map.ob, map.ob};
      if (ne == nb) {
        const uint32_t p =
            nb < static_cast<int64_t>(map.table.size()) ? map.table[nb].first : map.oe;
        return {p, p};
      }
      return {map.table[nb].first, map.table[ne - 1].second};
    }
    case SegMap::Kind::kCoarse:
      return {map.ob, map.oe};
  }
  return {map.ob, map.oe};
}

void Tokenizer::Impl::find_added(
    const TokenTrie& trie, std::string_view s, const std::function<void(size_t, size_t)>& on_text,
    const std::function<void(int32_t, size_t, size_t)>& on_token) const {
  size_t start_offset = 0;
  size_t pos = 0;
  size_t b, e;
  int32_t t;
  auto ends_with_word = [&](size_t end) {
    if (end == 0) return false;
    size_t i = unicode::previous_code_point_start(s, end);
    return unicode::is_word_char(unicode::next_code_point(s, i));
  };
  auto starts_with_word = [&](size_t begin) {
    if (begin >= s.size()) return false;
    size_t i = begin;
    return unicode::is_word_char(unicode::next_code_point(s, i));
  };
  while (pos < s.size() && trie.find(s, pos, b, e, t)) {
    pos = e;
    const AddedToken& tok = added[t];
    if (tok.single_word && (ends_with_word(b) || starts_with_word(e))) continue;
    if (tok.lstrip) {
      size_t nb = b;
      while (nb > 0) {
        const size_t p = unicode::previous_code_point_start(s, nb);
        size_t q = p;
        if (!unicode::is_white_space(unicode::next_code_point(s, q))) break;
        nb = p;
      }
      b = std::max(nb, start_offset);
    }
    if (tok.rstrip) {
      while (e < s.size()) {
        size_t q = e;
        if (!unicode::is_white_space(unicode::next_code_point(s, q))) break;
        e = q;
      }
      pos = e;
    }
    if (start_offset < b) on_text(start_offset, b);
    on_token(tok.id, b, e);
    start_offset = e;
  }
  if (start_offset < s.size()) on_text(start_offset, s.size());
}

void Tokenizer::Impl::emit_word(const Piece& piece, const SegMap* map, Output out,
                                Work& work) const {
  if (!out.offsets) {
    bpe->encode_word(piece.text, *out.ids, nullptr);
    return;
  }
  work.lengths.clear();
  const size_t first = out.ids->size();
  bpe->encode_word(piece.text, *out.ids, &work.lengths);
  int64_t pos = piece.norm_base;
  for (size_t k = 0; k < out.ids->size() - first; ++k) {
    const int64_t next = pos + work.lengths[k];
    out.offsets->push_back(to_input(*map, pos, next, piece.nb, piece.ne));
    pos = next;
  }
}

void Tokenizer::Impl::run_pretokenizers(size_t step, const Piece& piece, const SegMap* map,
                                        Output out, Work& work) const {
  if (piece.text.empty()) return;
  if (step == pretokenizers.size()) {
    emit_word(piece, map, out, work);
    return;
  }
  const PreTokStep& s = pretokenizers[step];
  auto sub = [&](size_t b, size_t e) {
    if (e <= b) return;
    Piece p{piece.text.substr(b, e - b), piece.norm_base + static_cast<int64_t>(b), piece.nb,
            piece.ne};
    run_pretokenizers(step + 1, p, map, out, work);
  };
  if (s.kind == PreTokStep::Kind::kByteLevel) {
    Piece p = piece;
    if (s.add_prefix_space && p.text[0] != ' ') {
      std::string& owned = work.arena.emplace_back();
      owned.reserve(p.text.size() + 1);
      owned.push_back(' ');
      owned.append(p.text);
      p.text = owned;
      p.norm_base -= 1;
    }
    if (!s.regex) {
      run_pretokenizers(step + 1, p, map, out, work);
      return;
    }
    size_t prev = 0;
    s.regex->for_each_match(p.text, [&](size_t b, size_t e) {
      if (prev < b) {
        Piece g{p.text.substr(prev, b - prev), p.norm_base + static_cast<int64_t>(prev), p.nb,
                p.ne};
        run_pretokenizers(step + 1, g, map, out, work);
      }
      Piece m{p.text.substr(b, e - b), p.norm_base + static_cast<int64_t>(b), p.nb, p.ne};
      run_pretokenizers(step + 1, m, map, out, work);
      prev = e;
    });
    if (prev < p.text.size()) {
      Piece g{p.text.substr(prev), p.norm_base + static_cast<int64_t>(prev), p.nb, p.ne};
      run_pretokenizers(step + 1, g, map, out, work);
    }
    return;
  }
  // Split / Digits: (begin, end, is_match) covering the piece, then the behavior.
  if (s.kind == PreTokStep::Kind::kSplit && s.behavior == SplitBehavior::kIsolated) {
    // Fast path: isolated matches and gaps are pieces in order, whatever invert says.
    size_t prev = 0;
    s.regex->for_each_match(piece.text, [&](size_t b, size_t e) {
      sub(prev, b);
      sub(b, e);
      prev = e;
    });
    sub(prev, piece.text.size());
    return;
  }
  std::vector<std::tuple<size_t, size_t, bool>> marks;
  if (s.kind == PreTokStep::Kind::kSplit) {
    size_t prev = 0;
    s.regex->for_each_match(piece.text, [&](size_t b, size_t e) {
      if (prev < b) marks.emplace_back(prev, b, false);
      marks.emplace_back(b, e, true);
      prev = e;
    });
    if (prev < piece.text.size()) marks.emplace_back(prev, piece.text.size(), false);
    if (s.invert) {
      for (auto& m : marks) std::get<2>(m) = !std::get<2>(m);
    }
  } else {
    // Digits: every numeric character is a match of its own (tokenizers' char pattern).
    size_t i = 0, last = 0;
    while (i < piece.text.size()) {
      const size_t c0 = i;
      if (unicode::is_numeric(unicode::next_code_point(piece.text, i))) {
        if (last < c0) marks.emplace_back(last, c0, false);
        marks.emplace_back(c0, i, true);
        last = i;
      }
    }
    if (last < piece.text.size()) marks.emplace_back(last, piece.text.size(), false);
  }
  const SplitBehavior behavior =
      s.kind == PreTokStep::Kind::kDigits
          ? (s.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous)
          : s.behavior;
  std::vector<std::pair<size_t, size_t>> spans;
  spans.reserve(marks.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [b, e, m] : marks) spans.emplace_back(b, e);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& [b, e, m] : marks) {
        if (!m) spans.emplace_back(b, e);
      }
      break;
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (const auto& [b, e, m] : marks) {
        if (m == prev_match && !spans.empty()) {
          spans.back().second = e;
        } else {
          spans.emplace_back(b, e);
        }
        prev_match = m;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const auto& [b, e, m] : marks) {
        if (m && !prev_match && !spans.empty()) {
          spans.back().second = e;
        } else {
          spans.emplace_back(b, e);
        }
        prev_match = m;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto it = marks.rbegin(); it != marks.rend(); ++it) {
        const auto& [b, e, m] = *it;
        if (m && !prev_match && !spans.empty()) {
          spans.back().first = b;
        } else {
          spans.emplace_back(b, e);
        }
        prev_match = m;
      }
      std::reverse(spans.begin(), spans.end());
      break;
    }
  }
  for (const auto& [b, e] : spans) sub(b, e);
}

void Tokenizer::Impl::encode_segment(std::string_view text, uint32_t ob, Output out,
                                     Work& work) const {
  // text is a part of the input between added tokens, starting at input offset ob.
  std::string& norm = work.arena.emplace_back();
  const bool changed = !normalizers.empty() && normalize(text, norm);
  const std::string_view ntext = changed ? std::string_view(norm) : text;
  SegMap* map = nullptr;
  SegMap local;
  if (out.offsets) {
    local.ob = ob;
    local.oe = ob + static_cast<uint32_t>(text.size());
    if (changed) build_table(text, ob, local);
    map = &local;
  }
  auto run = [&](size_t b, size_t e) {
    Piece p{ntext.substr(b, e - b), static_cast<int64_t>(b), static_cast<uint32_t>(b),
            static_cast<uint32_t>(e)};
    run_pretokenizers(0, p, map, out, work);
  };
  if (normalized_trie.empty()) {
    run(0, ntext.size());
    return;
  }
  find_added(normalized_trie, ntext, run, [&](int32_t id, size_t b, size_t e) {
    out.ids->push_back(id);
    if (out.offsets) {
      out.offsets->push_back(to_input(*map, static_cast<int64_t>(b), static_cast<int64_t>(e), 0,
                                      static_cast<uint32_t>(ntext.size())));
    }
  });
}

void Tokenizer::Impl::encode(std::string_view text, bool add_special, Output out) const {
  const size_t bad = unicode::find_invalid(text);
  if (bad != std::string_view::npos) {
    LT_THROW(ErrorKind::kInput, "tokenizer input is not valid UTF-8 at byte ", bad,
             " (use utf8_replace_invalid() to substitute U+FFFD as Python's "
             "errors='replace' does)");
  }
  LT_CHECK_INPUT(text.size() < (1ULL << 32) - 1, "tokenizer input of ", text.size(),
                 " bytes is too long (limit 4 GiB)");
  thread_local Work work;
  work.arena.clear();
  std::vector<int32_t> body_ids;
  std::vector<std::pair<uint32_t, uint32_t>> body_offsets;
  const bool wrap = add_special && has_template;
  Output body{wrap ? &body_ids : out.ids,
              out.offsets ? (wrap ? &body_offsets : out.offsets) : nullptr};
  if (raw_trie.empty()) {
    encode_segment(text, 0, body, work);
  } else {
    find_added(
        raw_trie, text,
        [&](size_t b, size_t e) {
          encode_segment(text.substr(b, e - b), static_cast<uint32_t>(b), body, work);
        },
        [&](int32_t id, size_t b, size_t e) {
          body.ids->push_back(id);
          if (body.offsets) {
            body.offsets->emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
          }
        });
  }
  if (!wrap) return;
  for (const TemplateItem& item : template_single) {
    if (item.is_sequence) {
      out.ids->insert(out.ids->end(), body_ids.begin(), body_ids.end());
      if (out.offsets) {
        out.offsets->insert(out.offsets->end(), body_offsets.begin(), body_offsets.end());
      }
    } else {
      for (int32_t id : item.special_ids) {
        out.ids->push_back(id);
        if (out.offsets) out.offsets->emplace_back(0, 0);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

std::shared_ptr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json,
                                                std::string_view tokenizer_config_json,
                                                std::string_view special_tokens_map_json,
                                                const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  ParsedTokenizerJson parsed = parse_tokenizer_json(tokenizer_json, source);
  const json& tj = parsed.root;
  LT_CHECK_INPUT(tj.is_object(), source, ": not a tokenizer.json object");
  try {
    impl->load_normalizer(member(tj, "normalizer"));
    impl->load_model(member(tj, "model"), parsed);
    impl->load_added(member(tj, "added_tokens"));
    impl->load_pretokenizer(member(tj, "pre_tokenizer"));
    impl->load_post_processor(member(tj, "post_processor"));
    impl->load_decoder(member(tj, "decoder"));
  } catch (const json::exception& e) {
    // A missing key or a value of the wrong type somewhere in the file.
    LT_THROW(ErrorKind::kInput, source, ": unexpected tokenizer.json content: ", e.what());
  }
  impl->finish();

  const std::string cfg_source = source + " (tokenizer_config.json)";
  json cfg = tokenizer_config_json.empty() ? json::object()
                                           : parse_json(tokenizer_config_json, cfg_source);
  json stm = special_tokens_map_json.empty()
                 ? json::object()
                 : parse_json(special_tokens_map_json, source + " (special_tokens_map.json)");
  for (auto [key, dst] : {std::pair{"bos_token", &impl->bos}, std::pair{"eos_token", &impl->eos},
                          std::pair{"pad_token", &impl->pad}, std::pair{"unk_token", &impl->unk}}) {
    // tokenizer_config.json takes precedence, as in transformers.
    *dst = config_token(cfg, key);
    if (!*dst) *dst = config_token(stm, key);
  }
  if (cfg.contains("chat_template")) {
    const json& ct = cfg["chat_template"];
    if (ct.is_string()) {
      impl->chat_source = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (const json& named : ct) {
        if (named.value("name", "") == "default") impl->chat_source = named.value("template", "");
      }
    }
  }
  auto tok = std::make_shared<Tokenizer>(std::move(impl));
  tok->impl_->chat_error.clear();
  try {
    const std::string dir = std::filesystem::path(source).parent_path().string();
    const std::string cfg_file = (dir.empty() ? "" : dir + "/") + "tokenizer_config.json";
    ChatTemplate t = ChatTemplate::detect(tok->impl_->chat_source, cfg_file + "[chat_template]");
    tok->impl_->give_special_tokens(t);
    tok->impl_->chat = std::move(t);
  } catch (const Error& e) {
    tok->impl_->chat_error = e.what();
  }
  return tok;
}

std::shared_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::error_code ec;
  LT_CHECK_INPUT(fs::exists(p, ec), "tokenizer path ", path, " does not exist");
  fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
  fs::path file = fs::is_directory(p, ec) ? p / "tokenizer.json" : p;
  LT_CHECK_INPUT(fs::exists(file, ec), "no tokenizer.json in ", path,
                 " (only tokenizer.json files are supported)");
  const std::string tj = read_file(file);
  const std::string cfg =
      fs::exists(dir / "tokenizer_config.json", ec) ? read_file(dir / "tokenizer_config.json") : "";
  const std::string stm = fs::exists(dir / "special_tokens_map.json", ec)
                              ? read_file(dir / "special_tokens_map.json")
                              : "";
  auto tok = from_json(tj, cfg, stm, file.string());
  // Newer Hugging Face folders keep the template in its own file, which wins.
  if (fs::exists(dir / "chat_template.jinja", ec)) {
    Impl& impl = *tok->impl_;
    impl.chat_source = read_file(dir / "chat_template.jinja");
    impl.chat.reset();
    impl.chat_error.clear();
    try {
      ChatTemplate t =
          ChatTemplate::detect(impl.chat_source, (dir / "chat_template.jinja").string());
      impl.give_special_tokens(t);
      impl.chat = std::move(t);
    } catch (const Error& e) {
      impl.chat_error = e.what();
    }
  }
  return tok;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, add_special_tokens, {&ids, nullptr});
  return ids;
}

EncodingWithOffsets Tokenizer::encode_with_offsets(std::string_view text,
                                                   bool add_special_tokens) const {
  EncodingWithOffsets enc;
  impl_->encode(text, add_special_tokens, {&enc.ids, &enc.offsets});
  return enc;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    LT_CHECK_INPUT(id >= 0 && id < m.vocab_size, "token id ", id, " is out of range [0, ",
                   m.vocab_size, ") for ", m.source);
    if (skip_special_tokens && m.special[id]) continue;
    if (m.id_to_token[id].empty()) continue;  // an id without a token, skipped as tokenizers does
    if (m.decoder == Impl::DecoderKind::kNone && !first) bytes.push_back(' ');
    bytes += m.decoded[id];
    first = false;
  }
  return unicode::replace_invalid(bytes);
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return a->second;
  return impl_->bpe->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size) return {};
  return impl_->id_to_token[id];
}

namespace {
std::optional<int32_t> lookup(const Tokenizer& t, const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  return t.token_to_id(*s);
}
}  // namespace

std::optional<int32_t> Tokenizer::bos_token_id() const { return lookup(*this, impl_->bos); }
std::optional<int32_t> Tokenizer::eos_token_id() const { return lookup(*this, impl_->eos); }
std::optional<int32_t> Tokenizer::pad_token_id() const { return lookup(*this, impl_->pad); }
std::optional<std::string> Tokenizer::bos_token() const { return impl_->bos; }
std::optional<std::string> Tokenizer::eos_token() const { return impl_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id] != 0;
}

const ChatTemplate& Tokenizer::chat_template() const {
  if (!impl_->chat) LT_THROW(ErrorKind::kInput, impl_->chat_error);
  return *impl_->chat;
}

std::vector<std::pair<std::string, std::string>> Tokenizer::special_tokens() const {
  return impl_->special_tokens();
}

bool Tokenizer::has_chat_template() const { return impl_->chat.has_value(); }

void Tokenizer::set_chat_template(const std::string& name) {
  ChatTemplate t = ChatTemplate::from_name(name);
  impl_->give_special_tokens(t);
  impl_->chat = std::move(t);
}

void Tokenizer::set_chat_template_kwargs(const nlohmann::ordered_json& kwargs) {
  LT_CHECK_INPUT(impl_->chat.has_value(), "--chat_template_kwargs: ", impl_->chat_error);
  impl_->chat->set_kwargs(kwargs);
}

const std::string& Tokenizer::chat_template_source() const { return impl_->chat_source; }
const std::string& Tokenizer::source_path() const { return impl_->source; }

std::string utf8_replace_invalid(std::string_view bytes) { return unicode::replace_invalid(bytes); }
size_t utf8_find_invalid(std::string_view bytes) { return unicode::find_invalid(bytes); }

}  // namespace leantune
