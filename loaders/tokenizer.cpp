// Tokenizer's public API (see tokenizer.h): loading a tokenizer folder or tokenizer.json text,
// the special tokens and chat template from tokenizer_config.json, and encode/decode on top of
// the pipeline in tokenizer_pipeline.cpp.
#include "loaders/tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/tokenizer_impl.h"

namespace leantune {

using namespace tokenizer_detail;

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
                                           : parse_json_strict(tokenizer_config_json, cfg_source);
  json stm =
      special_tokens_map_json.empty()
          ? json::object()
          : parse_json_strict(special_tokens_map_json, source + " (special_tokens_map.json)");
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
  const std::string tj = read_text_file(file);
  const std::string cfg = fs::exists(dir / "tokenizer_config.json", ec)
                              ? read_text_file(dir / "tokenizer_config.json")
                              : "";
  const std::string stm = fs::exists(dir / "special_tokens_map.json", ec)
                              ? read_text_file(dir / "special_tokens_map.json")
                              : "";
  auto tok = from_json(tj, cfg, stm, file.string());
  // Newer Hugging Face folders keep the template in its own file, which wins.
  if (fs::exists(dir / "chat_template.jinja", ec)) {
    Impl& impl = *tok->impl_;
    impl.chat_source = read_text_file(dir / "chat_template.jinja");
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
