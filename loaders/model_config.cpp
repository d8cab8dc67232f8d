// config.json <-> ModelConfig. Rules and defaults are listed in model_config.h.
#include "loaders/model_config.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "engine/check.h"
#include "loaders/fs_util.h"

namespace leantune {

using nlohmann::json;

namespace {

constexpr const char* kLlama = "LlamaForCausalLM";
constexpr const char* kQwen2 = "Qwen2ForCausalLM";
constexpr const char* kLlamaSeqCls = "LlamaForSequenceClassification";
constexpr const char* kQwen2SeqCls = "Qwen2ForSequenceClassification";

// The largest value each shape key may have: far beyond any published model, and small enough
// that every size derived from them (parameters, bytes per layer, the estimate's terms) fits in
// 64 bits.
constexpr std::pair<const char*, int64_t> kShapeLimits[] = {
    {"hidden_size", int64_t{1} << 20},
    {"intermediate_size", int64_t{1} << 22},
    {"num_hidden_layers", int64_t{1} << 14},
    {"num_attention_heads", int64_t{1} << 12},
    {"num_key_value_heads", int64_t{1} << 12},
    {"head_dim", int64_t{1} << 12},
    {"max_position_embeddings", int64_t{1} << 24},
    {"num_labels", int64_t{1} << 20},
};

int64_t shape_limit(const std::string& key) {
  for (const auto& [k, limit] : kShapeLimits)
    if (key == k) return limit;
  LT_THROW(ErrorKind::kInternal, "no shape limit for config key ", key);
}

// Key lookups that treat null as absent and name the file and key in every error.
class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), source_(source) {}

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    LT_THROW(ErrorKind::kInput, source_, ": key '", key, "' ", what);
  }
  std::string got(const json& v) const { return ", got " + printable(v.dump(), 60); }

  int64_t integer(const json& v, const std::string& key) const {
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) fail(key, "is too large");
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    fail(key, "must be an integer" + got(v));
  }
  int64_t positive(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (!fallback) fail(key, "is missing");
      return *fallback;
    }
    const int64_t x = integer(*v, key);
    if (x <= 0) fail(key, "must be a positive integer" + got(*v));
    return x;
  }
  // A positive integer at most `limit` (kShapeLimits).
  int64_t shape(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    const int64_t x = positive(key, fallback);
    const int64_t limit = shape_limit(key);
    if (x > limit)
      fail(key, "is " + std::to_string(x) + ", more than the " + std::to_string(limit) +
                    " leantune accepts (the largest models use a small fraction of it)");
    return x;
  }
  std::optional<int64_t> optional_int(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    return integer(*v, key);
  }
  double number(const json& v, const std::string& key) const {
    if (!v.is_number()) fail(key, "must be a number" + got(v));
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail(key, "must be finite" + got(v));
    return x;
  }
  double positive_number(const char* key, double fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    const double x = number(*v, key);
    if (x <= 0) fail(key, "must be positive" + got(*v));
    return x;
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, "must be true or false" + got(*v));
    return v->get<bool>();
  }
  const std::string& source() const { return source_; }

 private:
  const json& j_;
  const std::string& source_;
};

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF64:
      return "float64";
    default:
      return "float32";
  }
}

// rope_scaling (or rope_parameters): the type and its parameters, into cfg.
void read_rope_scaling(const json& rs, const std::string& key, const Reader& top,
                       kernels::RopeConfig* cfg) {
  if (!rs.is_object()) top.fail(key, "must be an object or null" + top.got(rs));
  const Reader r(rs, top.source());
  auto sub = [&](const char* k) { return key + "." + k; };
  const json* type = r.find("rope_type");
  if (type == nullptr) type = r.find("type");
  std::string t = "default";
  if (type != nullptr) {
    if (!type->is_string()) top.fail(sub("rope_type"), "must be a string" + top.got(*type));
    t = type->get<std::string>();
  }
  auto need = [&](const char* k) -> const json& {
    const json* v = r.find(k);
    if (v == nullptr) top.fail(sub(k), "is missing (required by rope type '" + t + "')");
    return *v;
  };
  if (t == "default") {
    cfg->scaling_type = "";
    return;
  }
  if (t != "linear" && t != "llama3") {
    top.fail(sub("rope_type"),
             "is '" + printable(t) + "', which is not supported (default, linear, llama3)");
  }
  cfg->scaling_type = t;
  cfg->factor = top.number(need("factor"), sub("factor"));
  if (cfg->factor <= 0) top.fail(sub("factor"), "must be positive");
  if (t == "llama3") {
    cfg->low_freq_factor = top.number(need("low_freq_factor"), sub("low_freq_factor"));
    cfg->high_freq_factor = top.number(need("high_freq_factor"), sub("high_freq_factor"));
    cfg->original_max_position_embeddings = top.integer(need("original_max_position_embeddings"),
                                                        sub("original_max_position_embeddings"));
    if (cfg->low_freq_factor <= 0 || cfg->high_freq_factor <= cfg->low_freq_factor) {
      top.fail(sub("high_freq_factor"), "must exceed low_freq_factor, which must be positive");
    }
    if (cfg->original_max_position_embeddings <= 0) {
      top.fail(sub("original_max_position_embeddings"), "must be positive");
    }
  }
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  LT_CHECK_INPUT(j.is_object(), source, ": config is not a JSON object");
  const Reader r(j, source);
  ModelConfig c;
  c.raw = j;

  std::string model_type;
  if (const json* mt = r.find("model_type")) {
    if (!mt->is_string()) r.fail("model_type", "must be a string" + r.got(*mt));
    model_type = mt->get<std::string>();
  }
  if (const json* arch = r.find("architectures")) {
    if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
      r.fail("architectures", "must be a non-empty list of names" + r.got(*arch));
    }
    c.architecture = (*arch)[0].get<std::string>();
  } else if (model_type == "llama") {
    c.architecture = kLlama;
  } else if (model_type == "qwen2") {
    c.architecture = kQwen2;
  } else {
    r.fail("architectures",
           model_type.empty()
               ? "is missing (and so is model_type)"
               : "is missing and model_type '" + printable(model_type) + "' is not llama or qwen2");
  }
  if (c.architecture == kLlama || c.architecture == kLlamaSeqCls) {
    c.model_type = "llama";
  } else if (c.architecture == kQwen2 || c.architecture == kQwen2SeqCls) {
    c.model_type = "qwen2";
  } else {
    LT_THROW(ErrorKind::kInput, source, ": unsupported architecture '", printable(c.architecture),
             "' (supported: ", kLlama, ", ", kQwen2, ", ", kLlamaSeqCls, ", ", kQwen2SeqCls, ")");
  }
  c.sequence_classification = c.architecture == kLlamaSeqCls || c.architecture == kQwen2SeqCls;
  if (c.sequence_classification) {
    // transformers' PretrainedConfig: num_labels is len(id2label), else the num_labels key, else 2.
    c.num_labels = 2;
    if (const json* labels = r.find("id2label")) {
      if (!labels->is_object() || labels->empty())
        r.fail("id2label", "must be a non-empty object" + r.got(*labels));
      c.num_labels = static_cast<int64_t>(labels->size());
    } else if (r.find("num_labels") != nullptr) {
      c.num_labels = r.shape("num_labels");
    }
  }
  if (!model_type.empty() && model_type != c.model_type) {
    r.fail("model_type",
           "is '" + printable(model_type) + "' but the architecture is " + c.architecture);
  }
  const bool llama = c.model_type == "llama";

  c.hidden_size = r.shape("hidden_size");
  c.intermediate_size = r.shape("intermediate_size");
  c.num_hidden_layers = r.shape("num_hidden_layers");
  c.num_attention_heads = r.shape("num_attention_heads");
  c.num_key_value_heads = r.shape("num_key_value_heads", c.num_attention_heads);
  c.vocab_size = r.positive("vocab_size");
  // Token ids are 32-bit everywhere (tokenizer, batches, kernels).
  if (c.vocab_size > INT32_MAX)
    r.fail("vocab_size", "is " + std::to_string(c.vocab_size) +
                             ", beyond the 2147483647 that 32-bit token ids can address");
  c.max_position_embeddings = r.shape("max_position_embeddings", llama ? 2048 : 32768);
  if (r.find("head_dim") == nullptr && c.hidden_size % c.num_attention_heads != 0) {
    r.fail("hidden_size", "(" + std::to_string(c.hidden_size) +
                              ") is not divisible by num_attention_heads (" +
                              std::to_string(c.num_attention_heads) + ") and head_dim is absent");
  }
  c.head_dim = r.shape("head_dim", c.hidden_size / c.num_attention_heads);
  if (c.head_dim % 2 != 0) {
    r.fail("head_dim", "must be even for rotary embeddings, got " + std::to_string(c.head_dim));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    r.fail("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) +
                                      ") must divide num_attention_heads (" +
                                      std::to_string(c.num_attention_heads) + ")");
  }
  c.rms_norm_eps = r.positive_number("rms_norm_eps", 1e-6);
  c.initializer_range = r.positive_number("initializer_range", 0.02);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  if (llama) {
    c.attention_bias = r.boolean("attention_bias", false);
    c.o_proj_bias = c.attention_bias;
    c.mlp_bias = r.boolean("mlp_bias", false);
  } else {
    c.attention_bias = true;
    c.o_proj_bias = false;
    c.mlp_bias = false;
  }

  c.rope.head_dim = c.head_dim;
  c.rope.scaling_type = "";
  const json* rope_params = r.find("rope_parameters");
  if (rope_params != nullptr) {
    read_rope_scaling(*rope_params, "rope_parameters", r, &c.rope);
    const Reader rp(*rope_params, source);
    c.rope.theta = rp.positive_number("rope_theta", r.positive_number("rope_theta", 10000.0));
  } else {
    c.rope.theta = r.positive_number("rope_theta", 10000.0);
    if (const json* rs = r.find("rope_scaling")) read_rope_scaling(*rs, "rope_scaling", r, &c.rope);
  }

  c.bos_token_id = r.optional_int("bos_token_id");
  c.pad_token_id = r.optional_int("pad_token_id");
  if (const json* eos = r.find("eos_token_id")) {
    if (eos->is_array()) {
      for (const auto& v : *eos) c.eos_token_ids.push_back(r.integer(v, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(r.integer(*eos, "eos_token_id"));
    }
  }

  const char* dtype_key = r.find("torch_dtype") ? "torch_dtype" : "dtype";
  if (const json* dt = r.find(dtype_key)) {
    if (!dt->is_string()) r.fail(dtype_key, "must be a string" + r.got(*dt));
    std::string name = dt->get<std::string>();
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
    if (!dtype_from_string(name, &c.torch_dtype) || !dtype_is_floating(c.torch_dtype) ||
        dtype_size(c.torch_dtype) < 2) {
      r.fail(dtype_key,
             "is '" + printable(name) + "', not one of float32, bfloat16, float16, float64");
    }
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& path_or_dir) {
  std::error_code ec;
  const std::string path = std::filesystem::is_directory(path_or_dir, ec)
                               ? (std::filesystem::path(path_or_dir) / "config.json").string()
                               : path_or_dir;
  return from_json(read_json_file(path), path);
}

json ModelConfig::to_json() const {
  json j = raw.is_object() ? raw : json::object();
  j["architectures"] = json::array({architecture});
  j["model_type"] = model_type;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  if (j.contains("head_dim") || head_dim * num_attention_heads != hidden_size) {
    j["head_dim"] = head_dim;
  }
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["initializer_range"] = initializer_range;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (model_type == "llama") {
    j["attention_bias"] = attention_bias;
    j["mlp_bias"] = mlp_bias;
  }

  json scaling = nullptr;
  if (!rope.scaling_type.empty() && rope.scaling_type != "default") {
    scaling = {{"rope_type", rope.scaling_type}, {"factor", rope.factor}};
    if (rope.scaling_type == "llama3") {
      scaling["low_freq_factor"] = rope.low_freq_factor;
      scaling["high_freq_factor"] = rope.high_freq_factor;
      scaling["original_max_position_embeddings"] = rope.original_max_position_embeddings;
    }
  }
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    json rp = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
    rp["rope_theta"] = rope.theta;
    j["rope_parameters"] = rp;
  } else {
    j["rope_theta"] = rope.theta;
    j["rope_scaling"] = scaling;
  }

  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  j["pad_token_id"] = pad_token_id ? json(*pad_token_id) : json(nullptr);
  const bool eos_was_list =
      raw.is_object() && raw.contains("eos_token_id") && raw["eos_token_id"].is_array();
  if (eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else if (eos_token_ids.size() == 1 && !eos_was_list) {
    j["eos_token_id"] = eos_token_ids[0];
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  if (sequence_classification) {
    // transformers writes the labels, not num_labels; LABEL_i is its default naming.
    if (!j.contains("id2label") || !j["id2label"].is_object() ||
        static_cast<int64_t>(j["id2label"].size()) != num_labels) {
      json id2label = json::object(), label2id = json::object();
      for (int64_t i = 0; i < num_labels; ++i) {
        id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
        label2id["LABEL_" + std::to_string(i)] = i;
      }
      j["id2label"] = id2label;
      j["label2id"] = label2id;
    }
    j.erase("num_labels");
  }
  const bool new_dtype_key = j.contains("dtype") && !j.contains("torch_dtype");
  j[new_dtype_key ? "dtype" : "torch_dtype"] = torch_dtype_name(torch_dtype);
  return j;
}

ModelConfig ModelConfig::as_sequence_classification(int64_t labels) const {
  LT_CHECK_INPUT(labels >= 1, "num_labels must be >= 1, got ", labels);
  ModelConfig c = *this;
  c.sequence_classification = true;
  c.num_labels = labels;
  c.architecture = model_type == "llama" ? kLlamaSeqCls : kQwen2SeqCls;
  if (c.raw.is_object()) {
    c.raw.erase("id2label");
    c.raw.erase("label2id");
  }
  return c;
}

void ModelConfig::save(const std::string& dir) const {
  write_text_atomic((std::filesystem::path(dir) / "config.json").string(),
                    to_json().dump(2) + "\n");
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim, inter = intermediate_size;
  int64_t layer = h * q + 2 * h * kv + q * h  // q, k, v, o projections
                  + 3 * h * inter             // gate, up, down
                  + 2 * h;                    // input and post-attention RMSNorm
  if (attention_bias) layer += q + 2 * kv;
  if (o_proj_bias) layer += h;
  if (mlp_bias) layer += 2 * inter + h;
  const int64_t embed = vocab_size * h;
  // A sequence classifier has the score head [num_labels, H] instead of an LM head.
  const int64_t head = sequence_classification ? num_labels * h : (tie_word_embeddings ? 0 : embed);
  return embed + num_hidden_layers * layer + h + head;
}

std::string ModelConfig::summary() const {
  std::ostringstream os;
  const double params = static_cast<double>(num_parameters());
  os << architecture << " (" << model_type << "): " << num_hidden_layers << " layers, hidden "
     << hidden_size << ", intermediate " << intermediate_size << ", " << num_attention_heads
     << " attention heads / " << num_key_value_heads << " key-value heads of dim " << head_dim
     << ", vocab " << vocab_size << ", max positions " << max_position_embeddings << ", rope theta "
     << rope.theta;
  if (!rope.scaling_type.empty()) {
    os << " with " << rope.scaling_type << " scaling (factor " << rope.factor;
    if (rope.scaling_type == "llama3") {
      os << ", low/high freq " << rope.low_freq_factor << "/" << rope.high_freq_factor
         << ", original max positions " << rope.original_max_position_embeddings;
    }
    os << ")";
  }
  os << ", rms_norm_eps " << rms_norm_eps << ", " << (tie_word_embeddings ? "tied" : "untied")
     << " embeddings";
  if (attention_bias) os << ", q/k/v bias";
  if (o_proj_bias) os << ", o_proj bias";
  if (mlp_bias) os << ", mlp bias";
  char scaled[32];
  std::snprintf(scaled, sizeof(scaled), "%.2f%s", params >= 1e9 ? params / 1e9 : params / 1e6,
                params >= 1e9 ? "B" : "M");
  os << ", " << torch_dtype_name(torch_dtype) << ", " << num_parameters() << " parameters ("
     << scaled << ").";
  return os.str();
}

}  // namespace leantune
