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

// The families: causal LM and sequence-classifier class names (nullptr: none supported),
// model_type, and transformers' default max_position_embeddings.
struct Family {
  const char* causal_lm;
  const char* seq_cls;
  const char* model_type;
  int64_t max_positions;
};
constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "LlamaForSequenceClassification", "llama", 2048},
    {"Qwen2ForCausalLM", "Qwen2ForSequenceClassification", "qwen2", 32768},
    {"Qwen3ForCausalLM", "Qwen3ForSequenceClassification", "qwen3", 32768},
    {"MistralForCausalLM", "MistralForSequenceClassification", "mistral", 131072},
    {"Phi3ForCausalLM", "Phi3ForSequenceClassification", "phi3", 4096},
    {"Gemma3ForCausalLM", nullptr, "gemma3_text", 131072},
};

const Family* family_of_type(const std::string& model_type) {
  for (const Family& f : kFamilies)
    if (model_type == f.model_type) return &f;
  return nullptr;
}

std::string supported_list() {
  std::string out;
  for (const Family& f : kFamilies) {
    out += (out.empty() ? "" : ", ") + std::string(f.causal_lm);
    if (f.seq_cls) out += std::string(", ") + f.seq_cls;
  }
  return out;
}

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

// rope_scaling (or rope_parameters): the type and its parameters, into cfg. `longrope_ok`: the
// family accepts longrope (phi3, which also maps the legacy "su" and "yarn" names to it).
void read_rope_scaling(const json& rs, const std::string& key, const Reader& top,
                       kernels::RopeConfig* cfg, bool longrope_ok = false) {
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
  if (longrope_ok && (t == "su" || t == "yarn")) t = "longrope";
  auto need = [&](const char* k) -> const json& {
    const json* v = r.find(k);
    if (v == nullptr) top.fail(sub(k), "is missing (required by rope type '" + t + "')");
    return *v;
  };
  if (t == "default") {
    cfg->scaling_type = "";
    return;
  }
  if (t != "linear" && t != "llama3" && !(longrope_ok && t == "longrope")) {
    top.fail(sub("rope_type"), "is '" + printable(t) + "', which is not supported (default, " +
                                   (longrope_ok ? "longrope" : "linear, llama3") + ")");
  }
  cfg->scaling_type = t;
  if (t == "longrope") {
    for (auto [k, dst] : {std::pair{"short_factor", &cfg->short_factor},
                          std::pair{"long_factor", &cfg->long_factor}}) {
      const json& v = need(k);
      if (!v.is_array()) top.fail(sub(k), "must be a list of numbers" + top.got(v));
      dst->clear();
      for (const json& x : v) dst->push_back(top.number(x, sub(k)));
    }
    if (const json* f = r.find("factor")) cfg->factor = top.number(*f, sub("factor"));
    if (const json* a = r.find("attention_factor"))
      cfg->attention_factor = top.number(*a, sub("attention_factor"));
    return;
  }
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

// The family's activation key: hidden_act (gemma3: hidden_activation, else hidden_act).
MlpActivation read_activation(const Reader& r, bool gemma) {
  const char* key = gemma && r.find("hidden_activation") ? "hidden_activation" : "hidden_act";
  const json* v = r.find(key);
  const char* want = gemma ? "gelu_pytorch_tanh" : "silu";
  if (v == nullptr) return gemma ? MlpActivation::kGeluTanh : MlpActivation::kSilu;
  if (!v->is_string() || v->get<std::string>() != want)
    r.fail(key, std::string("must be \"") + want + "\" for this architecture" + r.got(*v));
  return gemma ? MlpActivation::kGeluTanh : MlpActivation::kSilu;
}

// layer_types: a list of "full_attention" / "sliding_attention", one per layer.
std::vector<bool> read_layer_types(const json& v, const Reader& r, int64_t layers) {
  if (!v.is_array() || static_cast<int64_t>(v.size()) != layers)
    r.fail("layer_types",
           "must list one type per layer (" + std::to_string(layers) + ")" + r.got(v));
  std::vector<bool> out;
  for (const json& t : v) {
    if (!t.is_string() ||
        (t.get<std::string>() != "full_attention" && t.get<std::string>() != "sliding_attention"))
      r.fail("layer_types",
             "entries must be \"full_attention\" or \"sliding_attention\"" + r.got(t));
    out.push_back(t.get<std::string>() == "sliding_attention");
  }
  return out;
}

// A non-negative float key that must be 0 (dropout this engine does not apply in training).
void require_zero(const Reader& r, const char* key) {
  if (const json* v = r.find(key); v && r.number(*v, key) != 0.0)
    r.fail(key, "must be 0 (dropout inside the decoder is not supported)" + r.got(*v));
}

// An optional positive number where null means off (0).
double optional_positive(const Reader& r, const char* key) {
  const json* v = r.find(key);
  if (v == nullptr) return 0.0;
  const double x = r.number(*v, key);
  if (x <= 0) r.fail(key, "must be positive or null" + r.got(*v));
  return x;
}

// The rope of every family but gemma3: rope_theta and rope_scaling, or rope_parameters.
void read_rope(const Reader& r, const std::string& source, ModelConfig& c, bool phi3) {
  c.rope.head_dim = c.head_dim;
  c.rope.scaling_type = "";
  const json* rope_params = r.find("rope_parameters");
  if (rope_params != nullptr) {
    read_rope_scaling(*rope_params, "rope_parameters", r, &c.rope, phi3);
    const Reader rp(*rope_params, source);
    c.rope.theta = rp.positive_number("rope_theta", r.positive_number("rope_theta", 10000.0));
  } else {
    c.rope.theta = r.positive_number("rope_theta", 10000.0);
    if (const json* rs = r.find("rope_scaling"))
      read_rope_scaling(*rs, "rope_scaling", r, &c.rope, phi3);
  }
  if (!phi3) return;
  // partial_rotary_factor (top level or in rope_parameters) and longrope's pretraining length,
  // which Phi3Config keeps at the top level (it wins over the rope dict, as in transformers).
  double partial = r.positive_number("partial_rotary_factor", 1.0);
  if (rope_params != nullptr && rope_params->is_object())
    partial = Reader(*rope_params, source).positive_number("partial_rotary_factor", partial);
  if (partial > 1.0) r.fail("partial_rotary_factor", "must be in (0, 1]");
  c.rope.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  if (c.rope.rotary_dim <= 0 || c.rope.rotary_dim % 2 != 0)
    r.fail("partial_rotary_factor",
           "gives a rotary dimension of " + std::to_string(c.rope.rotary_dim) + ", not even");
  if (c.rope.scaling_type != "longrope") return;
  int64_t omp = c.max_position_embeddings;
  if (rope_params != nullptr && rope_params->is_object())
    omp = Reader(*rope_params, source).positive("original_max_position_embeddings", omp);
  c.rope.original_max_position_embeddings = r.positive("original_max_position_embeddings", omp);
  const int64_t half = c.rope.rotary_dim / 2;
  for (auto [k, v] : {std::pair{"short_factor", &c.rope.short_factor},
                      std::pair{"long_factor", &c.rope.long_factor}})
    if (static_cast<int64_t>(v->size()) != half)
      r.fail(std::string("rope_scaling.") + k, "has " + std::to_string(v->size()) +
                                                   " values, the rotary dimension needs " +
                                                   std::to_string(half));
  // transformers' _compute_longrope_parameters: factor defaults to max / original positions,
  // and the attention factor to sqrt(1 + log(factor) / log(original)) when factor > 1.
  const bool has_factor =
      rope_params ? rope_params->contains("factor") && !(*rope_params)["factor"].is_null()
                  : r.find("rope_scaling")->contains("factor") &&
                        !(*r.find("rope_scaling"))["factor"].is_null();
  const double factor = has_factor
                            ? c.rope.factor
                            : static_cast<double>(c.max_position_embeddings) /
                                  static_cast<double>(c.rope.original_max_position_embeddings);
  c.rope.factor = factor;
  const json& rs = rope_params ? *rope_params : *r.find("rope_scaling");
  if (!rs.contains("attention_factor") || rs["attention_factor"].is_null())
    c.rope.attention_factor =
        factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(
                                                     c.rope.original_max_position_embeddings)));
}

// Gemma 3's two ropes: global (full_attention) and local (sliding_attention), from the nested
// rope_parameters or the legacy rope_theta / rope_scaling / rope_local_base_freq keys.
void read_gemma_rope(const Reader& r, const std::string& source, ModelConfig& c) {
  c.rope.head_dim = c.rope_local.head_dim = c.head_dim;
  c.rope.scaling_type = c.rope_local.scaling_type = "";
  c.has_rope_local = true;
  const json* rp = r.find("rope_parameters");
  if (rp != nullptr && rp->is_object() &&
      (rp->contains("full_attention") || rp->contains("sliding_attention"))) {
    for (auto [k, cfg, theta] : {std::tuple{"full_attention", &c.rope, 1e6},
                                 std::tuple{"sliding_attention", &c.rope_local, 1e4}}) {
      const std::string key = std::string("rope_parameters.") + k;
      const json* sub = Reader(*rp, source).find(k);
      if (sub == nullptr) {
        cfg->theta = theta;
        continue;
      }
      read_rope_scaling(*sub, key, r, cfg);
      cfg->theta = Reader(*sub, source).positive_number("rope_theta", theta);
    }
    return;
  }
  if (rp != nullptr) {  // one rope_parameters dict: the global layers' (rope_scaling's place)
    read_rope_scaling(*rp, "rope_parameters", r, &c.rope);
    c.rope.theta =
        Reader(*rp, source).positive_number("rope_theta", r.positive_number("rope_theta", 1e6));
  } else {
    c.rope.theta = r.positive_number("rope_theta", 1e6);
    if (const json* rs = r.find("rope_scaling")) read_rope_scaling(*rs, "rope_scaling", r, &c.rope);
  }
  c.rope_local.theta = r.positive_number("rope_local_base_freq", 1e4);
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
  const Family* fam = nullptr;
  if (const json* arch = r.find("architectures")) {
    if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
      r.fail("architectures", "must be a non-empty list of names" + r.got(*arch));
    }
    c.architecture = (*arch)[0].get<std::string>();
  } else if (const Family* f = family_of_type(model_type)) {
    c.architecture = f->causal_lm;
  } else {
    r.fail("architectures", model_type.empty()
                                ? "is missing (and so is model_type)"
                                : "is missing and model_type '" + printable(model_type) +
                                      "' is not one this engine runs");
  }
  for (const Family& f : kFamilies) {
    if (c.architecture == f.causal_lm || (f.seq_cls && c.architecture == f.seq_cls)) {
      fam = &f;
      c.sequence_classification = f.seq_cls && c.architecture == f.seq_cls;
    }
  }
  if (fam == nullptr) {
    LT_THROW(ErrorKind::kInput, source, ": unsupported architecture '", printable(c.architecture),
             "' (supported: ", supported_list(), ")");
  }
  c.model_type = fam->model_type;
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
  const std::string& mt = c.model_type;
  const bool llama = mt == "llama", qwen3 = mt == "qwen3", mistral = mt == "mistral",
             phi3 = mt == "phi3", gemma = mt == "gemma3_text";

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
  c.max_position_embeddings = r.shape("max_position_embeddings", fam->max_positions);
  // Qwen3Config and Gemma3TextConfig default head_dim to a number of their own.
  const std::optional<int64_t> head_dim_default = qwen3   ? std::optional<int64_t>(128)
                                                  : gemma ? std::optional<int64_t>(256)
                                                          : std::nullopt;
  if (r.find("head_dim") == nullptr && !head_dim_default &&
      c.hidden_size % c.num_attention_heads != 0) {
    r.fail("hidden_size", "(" + std::to_string(c.hidden_size) +
                              ") is not divisible by num_attention_heads (" +
                              std::to_string(c.num_attention_heads) + ") and head_dim is absent");
  }
  c.head_dim =
      r.shape("head_dim", head_dim_default.value_or(c.hidden_size / c.num_attention_heads));
  if (c.head_dim % 2 != 0) {
    r.fail("head_dim", "must be even for rotary embeddings, got " + std::to_string(c.head_dim));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    r.fail("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) +
                                      ") must divide num_attention_heads (" +
                                      std::to_string(c.num_attention_heads) + ")");
  }
  c.rms_norm_eps = r.positive_number("rms_norm_eps", phi3 ? 1e-5 : 1e-6);
  c.initializer_range = r.positive_number("initializer_range", 0.02);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", gemma);
  if (llama) {
    c.attention_bias = r.boolean("attention_bias", false);
    c.o_proj_bias = c.attention_bias;
    c.mlp_bias = r.boolean("mlp_bias", false);
  } else if (mt == "qwen2") {
    c.attention_bias = true;
    c.o_proj_bias = false;
    c.mlp_bias = false;
  } else if (qwen3 || gemma) {
    c.attention_bias = c.o_proj_bias = r.boolean("attention_bias", false);
  }
  c.mlp_activation = read_activation(r, gemma);
  c.qk_norm = qwen3 || gemma;
  c.fused_qkv = c.fused_gate_up = phi3;
  c.norm_unit_offset = c.sandwich_norms = c.scale_embeddings = gemma;
  if (phi3)
    for (const char* k : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) require_zero(r, k);

  // Sliding windows: which layers, and how wide.
  const int64_t layers = c.num_hidden_layers;
  if (mistral || phi3) {
    const json* w = r.find("sliding_window");
    const bool absent = j.find("sliding_window") == j.end();
    c.sliding_window = w ? r.positive("sliding_window") : (mistral && absent ? 4096 : 0);
    c.sliding_layers.assign(static_cast<size_t>(layers), c.sliding_window > 0);
  } else if (qwen3) {
    if (r.boolean("use_sliding_window", false)) {
      c.sliding_window = r.find("sliding_window") ? r.positive("sliding_window") : 4096;
      const int64_t first = r.find("max_window_layers")
                                ? r.integer(*r.find("max_window_layers"), "max_window_layers")
                                : 28;
      for (int64_t l = 0; l < layers; ++l) c.sliding_layers.push_back(l >= first);
    }
    if (const json* lt = r.find("layer_types")) c.sliding_layers = read_layer_types(*lt, r, layers);
    if (c.sliding_window == 0) c.sliding_layers.clear();
  } else if (gemma) {
    c.sliding_window = r.positive("sliding_window", 4096);
    if (const json* lt = r.find("layer_types")) {
      c.sliding_layers = read_layer_types(*lt, r, layers);
    } else {
      const int64_t pattern = r.positive("sliding_window_pattern", 6);
      for (int64_t l = 0; l < layers; ++l) c.sliding_layers.push_back((l + 1) % pattern != 0);
    }
    if (r.boolean("use_bidirectional_attention", false))
      r.fail("use_bidirectional_attention", "is not supported (causal decoders only)");
    c.attention_scale = 1.0 / std::sqrt(r.positive_number("query_pre_attn_scalar", 256.0));
    c.final_logit_softcapping = optional_positive(r, "final_logit_softcapping");
    // attn_logit_softcapping: transformers' Gemma3 attention never passes it to the attention
    // (only Gemma 2's does), so a Gemma 3 model computes without it whatever the file says.
  }

  if (gemma)
    read_gemma_rope(r, source, c);
  else
    read_rope(r, source, c, phi3);

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
  } else if (model_type == "qwen3" || model_type == "gemma3_text") {
    j["attention_bias"] = attention_bias;
  }
  write_rope(j);
  write_common(j);
  return j;
}

void ModelConfig::write_rope(json& j) const {
  // Gemma 3's two ropes and longrope's factor lists stay as the file had them (nothing changes
  // them); the other families' rope is written from the fields.
  if (has_rope_local || rope.scaling_type == "longrope") return;
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
}

void ModelConfig::write_common(json& j) const {
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
}

ModelConfig ModelConfig::as_sequence_classification(int64_t labels) const {
  LT_CHECK_INPUT(labels >= 1, "num_labels must be >= 1, got ", labels);
  ModelConfig c = *this;
  c.sequence_classification = true;
  c.num_labels = labels;
  const Family* f = family_of_type(model_type);
  LT_CHECK_INPUT(f && f->seq_cls, architecture,
                 " has no sequence-classification variant in this engine (reward models: ",
                 supported_list(), ")");
  c.architecture = f->seq_cls;
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

int64_t ModelConfig::layer_norm_parameters() const {
  return (sandwich_norms ? 4 : 2) * hidden_size + (qk_norm ? 2 * head_dim : 0);
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim, inter = intermediate_size;
  int64_t layer = h * q + 2 * h * kv + q * h  // q, k, v, o projections (fused or not)
                  + 3 * h * inter             // gate, up, down
                  + layer_norm_parameters();
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
  if (rope.scaling_type == "longrope")
    os << " (short/long factors switching above " << rope.original_max_position_embeddings
       << " positions, attention factor " << rope.attention_factor << ")";
  if (rope.rotary() != head_dim) os << ", rotary dim " << rope.rotary();
  if (has_rope_local) os << ", sliding layers' rope theta " << rope_local.theta;
  if (sliding_window > 0) {
    int64_t n = 0;
    for (bool b : sliding_layers) n += b;
    os << ", sliding window " << sliding_window << " on " << n << " of " << num_hidden_layers
       << " layers";
  }
  os << ", rms_norm_eps " << rms_norm_eps << ", " << (tie_word_embeddings ? "tied" : "untied")
     << " embeddings";
  if (qk_norm) os << ", q/k norms";
  if (sandwich_norms) os << ", pre/post-feedforward norms";
  if (norm_unit_offset) os << ", (1 + w) norms";
  if (fused_qkv) os << ", fused qkv_proj and gate_up_proj";
  if (mlp_activation == MlpActivation::kGeluTanh) os << ", GeGLU (tanh)";
  if (scale_embeddings) os << ", embeddings scaled by sqrt(hidden)";
  if (attention_scale > 0) os << ", attention scale " << attention_scale;
  if (final_logit_softcapping > 0) os << ", final logit soft-cap " << final_logit_softcapping;
  if (attn_logit_softcapping > 0) os << ", attention soft-cap " << attn_logit_softcapping;
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
