// PEFT module selection and adapter files (see peft_io.h).
#include "models/peft_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <unordered_map>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/rng.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"

namespace leantune {

namespace {

constexpr const char* kAllLinear = "all-linear";
constexpr const char* kEmbedName = "model.embed_tokens.weight";
constexpr const char* kAdapterFile = "adapter_model.safetensors";
constexpr const char* kConfigFile = "adapter_config.json";
// The PEFT release whose adapter_config.json field set save_adapter writes.
constexpr const char* kPeftFormatVersion = "0.21.2";

std::string last_component(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// A parameter's module: its name without ".weight" / ".bias".
std::string module_of(const std::string& param) {
  for (const char* s : {".weight", ".bias"})
    if (param.ends_with(s)) return param.substr(0, param.size() - std::strlen(s));
  return param;
}

std::regex make_regex(const std::string& pattern, const std::string& what) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    LT_THROW(ErrorKind::kInput, what, ": '", pattern, "' is not a valid regular expression (",
             e.what(), ")");
  }
}

// PEFT's get_pattern_key: the first key with "(.*\.)?(key)$" matching the module name.
template <typename V>
const V* pattern_value(const std::map<std::string, V>& patterns, const std::string& module,
                       const char* what) {
  for (const auto& [key, value] : patterns)
    if (std::regex_match(module, make_regex("(.*\\.)?(" + key + ")", what))) return &value;
  return nullptr;
}

bool fused_layers(const ModelConfig& cfg) { return cfg.fused_qkv || cfg.fused_gate_up; }

std::vector<std::string> default_targets(const ModelConfig& cfg) {
  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the supported architectures
  // (phi3 has no entry there: PEFT asks for target_modules, and so does this).
  for (const char* t : {"llama", "qwen2", "qwen3", "mistral", "gemma3_text"})
    if (cfg.model_type == t) return {"q_proj", "v_proj"};
  LT_THROW(ErrorKind::kInput, "lora_target_modules: no default for model_type '", cfg.model_type,
           "' (as in PEFT); list the modules (for ", cfg.model_type,
           fused_layers(cfg) ? ": qkv_proj, o_proj, gate_up_proj, down_proj" : "",
           ") or use all-linear");
}

void check_config(const PeftConfig& c) {
  LT_CHECK_INPUT(c.r > 0, "lora_r must be positive, got ", c.r);
  LT_CHECK_INPUT(std::isfinite(c.lora_alpha), "lora_alpha must be finite, got ", c.lora_alpha);
  LT_CHECK_INPUT(c.lora_dropout >= 0.0 && c.lora_dropout < 1.0,
                 "lora_dropout must be in [0, 1), got ", c.lora_dropout);
  for (const auto& [k, r] : c.rank_pattern)
    LT_CHECK_INPUT(r > 0, "rank_pattern['", k, "'] must be positive, got ", r);
  const bool all_linear = std::find(c.target_modules.begin(), c.target_modules.end(), kAllLinear) !=
                          c.target_modules.end();
  LT_CHECK_INPUT(!all_linear || c.target_modules.size() == 1,
                 "lora_target_modules: all-linear cannot be combined with other entries");
}

// Attaches the structure (zero A and B) without drawing any random number.
PeftSetup attach(const PeftConfig& cfg_in, DecoderModel& model, uint64_t seed) {
  check_config(cfg_in);
  remove_peft(model);
  model.set_requires_grad(false);
  PeftSetup s;
  s.config = cfg_in;
  s.runtime = std::make_shared<LoraRuntime>();
  s.runtime->dropout_gen = std::make_shared<Generator>(seed, RngPurpose::kDropout);
  register_dropout_generator(s.runtime->dropout_gen);

  // modules_to_save: trained whole, in place.
  std::vector<std::pair<std::string, Tensor>> params = model.named_parameters();
  for (const std::string& entry : s.config.modules_to_save) {
    LT_CHECK_INPUT(!entry.empty(), "lora_modules_to_save: empty entry");
    bool found = false;
    for (auto& [name, t] : params) {
      if (!module_of(name).ends_with(entry)) continue;
      LT_CHECK_INPUT(t.defined(), "lora_modules_to_save: '", entry, "' selects ", name,
                     ", which is stored quantized and cannot be trained whole");
      found = true;
      if (std::find(s.saved_modules.begin(), s.saved_modules.end(), name) ==
          s.saved_modules.end()) {
        s.saved_modules.push_back(name);
        t.set_requires_grad(true);
      }
    }
    LT_CHECK_INPUT(found, "lora_modules_to_save: '", entry, "' matches no module of the model",
                   model.tied() && entry == "lm_head"
                       ? " (lm_head is tied to model.embed_tokens in this model)"
                       : "");
  }

  // LoRA targets.
  std::vector<std::string>& targets = s.config.target_modules;
  const bool use_regex = !s.config.target_regex.empty();
  if (!use_regex && targets.empty()) targets = default_targets(model.config());
  const bool all_linear = !use_regex && targets.size() == 1 && targets[0] == kAllLinear;
  std::regex target_re;
  if (use_regex) target_re = make_regex(s.config.target_regex, "target_modules");
  std::vector<std::regex> save_res;
  for (const std::string& m : s.config.modules_to_save)
    save_res.push_back(make_regex("(^|.*\\.)" + m + "($|\\..*)", "modules_to_save"));
  std::vector<int> hits(targets.size(), 0);
  std::set<std::string> kinds;
  for (LinearModule* m : model.linear_modules()) {
    const bool is_head = m->name == "lm_head";
    bool hit = false;
    if (use_regex) {
      hit = std::regex_match(m->name, target_re);
    } else if (all_linear) {
      hit = !is_head;
    } else {
      for (size_t i = 0; i < targets.size(); ++i)
        if (m->name == targets[i] || m->name.ends_with("." + targets[i])) {
          hit = true;
          ++hits[i];
        }
    }
    if (!hit) continue;
    bool excluded = false;
    for (const std::regex& re : save_res) excluded = excluded || std::regex_match(m->name, re);
    if (excluded) continue;
    LT_CHECK_INPUT(!is_head,
                   "lora_target_modules: LoRA on lm_head is not supported (the head "
                   "runs inside the fused loss); train it with lora_modules_to_save");
    const int64_t* r_override = pattern_value(s.config.rank_pattern, m->name, "rank_pattern");
    const double* a_override = pattern_value(s.config.alpha_pattern, m->name, "alpha_pattern");
    const DType dtype = m->base ? model.dtype() : m->weight.dtype();
    auto adapter = std::make_shared<LoraAdapter>(
        m->name, m->in_features, m->out_features, r_override ? *r_override : s.config.r,
        a_override ? *a_override : s.config.lora_alpha, s.config.use_rslora, s.config.lora_dropout,
        model.device(), dtype, s.runtime);
    m->adapter = adapter;
    s.adapters.push_back(adapter);
    kinds.insert(last_component(m->name));
  }
  if (!use_regex && !all_linear) {
    std::set<std::string> layer_kinds;
    for (LinearModule* m : model.linear_modules())
      if (m->name != "lm_head") layer_kinds.insert(last_component(m->name));
    std::string listed;
    for (const std::string& k : layer_kinds) listed += (listed.empty() ? "" : ", ") + k;
    for (size_t i = 0; i < targets.size(); ++i)
      LT_CHECK_INPUT(hits[i] > 0, "lora_target_modules: '", targets[i],
                     "' matches no linear layer of the model (layers: ", listed,
                     "; or all-linear)");
  }
  if (all_linear) targets.assign(kinds.begin(), kinds.end());

  // Trainable tokens.
  if (!s.config.trainable_token_indices.empty()) {
    LT_CHECK_INPUT(std::find(s.saved_modules.begin(), s.saved_modules.end(), kEmbedName) ==
                       s.saved_modules.end(),
                   "trainable_token_indices cannot be combined with training embed_tokens whole "
                   "(lora_modules_to_save)");
    s.tokens = std::make_shared<TrainableTokens>(model, s.config.trainable_token_indices);
    TrainableTokens::attach(s.tokens, model);
  }
  LT_CHECK_INPUT(!s.adapters.empty() || s.tokens || !s.saved_modules.empty(),
                 "the PEFT config selects nothing to train");
  return s;
}

// ---- adapter_config.json reading helpers: every type error names the file and the key.

const nlohmann::json* field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void bad_field(const std::string& file, const char* key, const char* expected) {
  LT_THROW(ErrorKind::kInput, file, ": field '", key, "' must be ", expected);
}

int64_t int_field(const nlohmann::json& j, const char* key, int64_t def, const std::string& file) {
  const nlohmann::json* v = field(j, key);
  if (!v) return def;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>())
    return static_cast<int64_t>(v->get<double>());
  bad_field(file, key, "an integer");
}

double num_field(const nlohmann::json& j, const char* key, double def, const std::string& file) {
  const nlohmann::json* v = field(j, key);
  if (!v) return def;
  if (!v->is_number()) bad_field(file, key, "a number");
  return v->get<double>();
}

bool bool_field(const nlohmann::json& j, const char* key, bool def, const std::string& file) {
  const nlohmann::json* v = field(j, key);
  if (!v) return def;
  if (!v->is_boolean()) bad_field(file, key, "true or false");
  return v->get<bool>();
}

std::vector<std::string> string_list(const nlohmann::json& v, const char* key,
                                     const std::string& file) {
  if (!v.is_array()) bad_field(file, key, "a list of strings");
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) bad_field(file, key, "a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<int64_t> int_list(const nlohmann::json& v, const char* key, const std::string& file) {
  if (!v.is_array()) bad_field(file, key, "a list of integers");
  std::vector<int64_t> out;
  for (const auto& e : v) {
    if (!e.is_number_integer()) bad_field(file, key, "a list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

// A field naming a PEFT feature this engine does not implement must be absent, null, false or
// empty.
void reject_feature(const nlohmann::json& j, const char* key, const std::string& file,
                    const char* feature) {
  const nlohmann::json* v = field(j, key);
  if (!v) return;
  const bool off =
      (v->is_boolean() && !v->get<bool>()) || ((v->is_array() || v->is_object()) && v->empty());
  LT_CHECK_INPUT(off, file, ": ", feature, " ('", key, "' = ", v->dump(),
                 ") is not supported by this engine");
}

Tensor to_disk(const Tensor& t) {
  const DType dt = t.dtype() == DType::kF64 ? DType::kF32 : t.dtype();
  if (dt == t.dtype() && t.device().is_cpu()) return t.detach();
  return t.detach().to(Device::cpu(), dt, MemTag::kOther);
}

nlohmann::json number_json(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return static_cast<int64_t>(v);
  return v;
}

}  // namespace

// ---------------------------------------------------------------- PeftSetup

std::vector<std::pair<std::string, Tensor>> PeftSetup::trainable_parameters(
    const DecoderModel& model) const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (tokens) out.emplace_back(kTrainableTokensKey, tokens->delta());
  const std::string prefix = kPeftKeyPrefix;
  for (const auto& a : adapters) {
    out.emplace_back(prefix + a->module_name() + ".lora_A.weight", a->lora_A());
    out.emplace_back(prefix + a->module_name() + ".lora_B.weight", a->lora_B());
  }
  if (!saved_modules.empty()) {
    std::unordered_map<std::string, Tensor> by_name;
    for (const auto& [name, t] : model.named_parameters()) by_name.emplace(name, t);
    for (const std::string& name : saved_modules) {
      auto it = by_name.find(name);
      LT_CHECK(it != by_name.end(), "modules_to_save parameter ", name, " vanished");
      out.emplace_back(prefix + name, it->second);
    }
  }
  return out;
}

int64_t PeftSetup::num_trainable_parameters(const DecoderModel& model) const {
  int64_t n = 0;
  for (const auto& [name, t] : trainable_parameters(model)) n += t.numel();
  return n;
}

void PeftSetup::set_training(bool on) {
  if (runtime) runtime->training = on;
}

void PeftSetup::set_adapters_enabled(bool on) {
  LT_CHECK_INPUT(on || saved_modules.empty(),
                 "adapters cannot be disabled for a reference pass when lora_modules_to_save is "
                 "used (those modules are trained in place)");
  if (runtime) runtime->enabled = on;
  if (tokens) tokens->set_enabled(on);
}

std::vector<std::string> PeftSetup::config_target_modules() const {
  std::set<std::string> s(config.target_modules.begin(), config.target_modules.end());
  return {s.begin(), s.end()};
}

// ---------------------------------------------------------------- attach / remove

PeftSetup apply_peft(const PeftConfig& cfg, DecoderModel& model, uint64_t seed) {
  PeftSetup s = attach(cfg, model, seed);
  Generator gen(seed, RngPurpose::kLoraInit);
  for (const auto& a : s.adapters) a->reset_parameters(gen);
  return s;
}

void remove_peft(DecoderModel& model) {
  for (LinearModule* m : model.linear_modules())
    if (dynamic_cast<LoraAdapter*>(m->adapter.get())) m->adapter.reset();
  TrainableTokens::detach(model);
}

// ---------------------------------------------------------------- files

nlohmann::json adapter_config_json(const PeftSetup& setup,
                                   const std::string& base_model_name_or_path) {
  const PeftConfig& c = setup.config;
  nlohmann::json rank = nlohmann::json::object(), alpha = nlohmann::json::object();
  for (const auto& [k, v] : c.rank_pattern) rank[k] = v;
  for (const auto& [k, v] : c.alpha_pattern) alpha[k] = number_json(v);
  nlohmann::json targets = c.target_regex.empty() ? nlohmann::json(setup.config_target_modules())
                                                  : nlohmann::json(c.target_regex);
  nlohmann::json j = {
      {"alora_invocation_tokens", nullptr},
      {"alpha_pattern", alpha},
      {"arrow_config", nullptr},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", base_model_name_or_path},
      {"bias", "none"},
      {"corda_config", nullptr},
      {"ensure_weight_tying", false},
      {"eva_config", nullptr},
      {"exclude_modules", nullptr},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"kasa_config", nullptr},
      {"layer_replication", nullptr},
      {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr},
      {"loftq_config", nlohmann::json::object()},
      {"lora_alpha", number_json(c.lora_alpha)},
      {"lora_bias", false},
      {"lora_dropout", c.lora_dropout},
      {"lora_ga_config", nullptr},
      {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"},
      {"modules_to_save",
       c.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.modules_to_save)},
      {"monteclora_config", nullptr},
      {"peft_type", "LORA"},
      {"peft_version", kPeftFormatVersion},
      {"qalora_group_size", 16},
      {"r", c.r},
      {"rank_pattern", rank},
      {"revision", nullptr},
      {"target_modules", targets},
      {"target_parameters", nullptr},
      {"task_type", c.task_type},
      {"trainable_token_indices", c.trainable_token_indices.empty()
                                      ? nlohmann::json(nullptr)
                                      : nlohmann::json(c.trainable_token_indices)},
      {"use_bdlora", nullptr},
      {"use_dora", false},
      {"use_qalora", false},
      {"use_rslora", c.use_rslora},
      {"velora_config", nullptr},
  };
  return j;
}

void save_adapter(const PeftSetup& setup, const DecoderModel& model, const std::string& dir,
                  const std::string& base_model_name_or_path) {
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : setup.trainable_parameters(model))
    tensors.emplace_back(name, to_disk(t));
  save_safetensors(dir + "/" + kAdapterFile, tensors, {{"format", "pt"}});
  write_text_atomic(dir + "/" + kConfigFile,
                    adapter_config_json(setup, base_model_name_or_path).dump(2));
}

bool is_adapter_dir(const std::string& dir) {
  return std::filesystem::is_regular_file(std::filesystem::path(dir) / kConfigFile);
}

PeftConfig read_adapter_config(const std::string& path, std::string* base_model_name_or_path) {
  const std::string file = std::filesystem::is_directory(path)
                               ? (std::filesystem::path(path) / kConfigFile).string()
                               : path;
  const nlohmann::json j = read_json_file(file);
  LT_CHECK_INPUT(j.is_object(), file, ": an adapter config must be a JSON object");
  const nlohmann::json* type = field(j, "peft_type");
  LT_CHECK_INPUT(type && type->is_string(), file, ": field 'peft_type' is missing");
  LT_CHECK_INPUT(type->get<std::string>() == "LORA", file, ": peft_type ", type->dump(),
                 " is not supported (only LORA)");
  reject_feature(j, "use_dora", file, "DoRA");
  reject_feature(j, "lora_bias", file, "LoRA bias");
  reject_feature(j, "fan_in_fan_out", file, "fan_in_fan_out");
  reject_feature(j, "layers_to_transform", file, "layers_to_transform");
  reject_feature(j, "layer_replication", file, "layer_replication");
  reject_feature(j, "exclude_modules", file, "exclude_modules");
  reject_feature(j, "target_parameters", file, "target_parameters");
  reject_feature(j, "use_qalora", file, "QALoRA");
  reject_feature(j, "alora_invocation_tokens", file, "aLoRA");
  if (const nlohmann::json* b = field(j, "bias"))
    LT_CHECK_INPUT(b->is_string() && b->get<std::string>() == "none", file, ": bias ", b->dump(),
                   " is not supported (only \"none\")");

  PeftConfig c;
  c.r = int_field(j, "r", 8, file);
  c.lora_alpha = num_field(j, "lora_alpha", 8, file);
  c.lora_dropout = num_field(j, "lora_dropout", 0.0, file);
  c.use_rslora = bool_field(j, "use_rslora", false, file);
  if (const nlohmann::json* t = field(j, "target_modules")) {
    if (t->is_string()) {
      std::string s = t->get<std::string>();
      std::string lower = s;
      std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
      if (lower == kAllLinear)
        c.target_modules = {kAllLinear};
      else
        c.target_regex = s;
    } else {
      c.target_modules = string_list(*t, "target_modules", file);
    }
  }
  if (const nlohmann::json* m = field(j, "modules_to_save"))
    c.modules_to_save = string_list(*m, "modules_to_save", file);
  if (const nlohmann::json* t = field(j, "task_type"); t && t->is_string())
    c.task_type = t->get<std::string>();
  if (c.task_type == "SEQ_CLS") {
    // PeftModelForSequenceClassification adds its head names to modules_to_save; of
    // "classifier" and "score" only the decoder classifiers' score exists here.
    std::erase(c.modules_to_save, std::string("classifier"));
    if (std::find(c.modules_to_save.begin(), c.modules_to_save.end(), "score") ==
        c.modules_to_save.end())
      c.modules_to_save.push_back("score");
  }
  if (const nlohmann::json* t = field(j, "trainable_token_indices")) {
    if (t->is_object()) {
      for (auto it = t->begin(); it != t->end(); ++it)
        LT_CHECK_INPUT(it.key() == "embed_tokens" || it.key().ends_with(".embed_tokens"), file,
                       ": trainable_token_indices for '", it.key(),
                       "' are not supported (only the input embedding)");
      if (!t->empty())
        c.trainable_token_indices = int_list(t->begin().value(), "trainable_token_indices", file);
    } else {
      c.trainable_token_indices = int_list(*t, "trainable_token_indices", file);
    }
  }
  if (const nlohmann::json* p = field(j, "rank_pattern")) {
    if (!p->is_object()) bad_field(file, "rank_pattern", "an object");
    for (auto it = p->begin(); it != p->end(); ++it) {
      if (!it.value().is_number_integer()) bad_field(file, "rank_pattern", "integers");
      c.rank_pattern[it.key()] = it.value().get<int64_t>();
    }
  }
  if (const nlohmann::json* p = field(j, "alpha_pattern")) {
    if (!p->is_object()) bad_field(file, "alpha_pattern", "an object");
    for (auto it = p->begin(); it != p->end(); ++it) {
      if (!it.value().is_number()) bad_field(file, "alpha_pattern", "numbers");
      c.alpha_pattern[it.key()] = it.value().get<double>();
    }
  }
  if (base_model_name_or_path) {
    const nlohmann::json* b = field(j, "base_model_name_or_path");
    *base_model_name_or_path = b && b->is_string() ? b->get<std::string>() : "";
  }
  return c;
}

void load_adapter_weights(const PeftSetup& setup, const DecoderModel& model,
                          const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / kAdapterFile).string();
  auto st = SafetensorsFile::open(file);
  std::unordered_map<std::string, Tensor> want;
  for (const auto& [name, t] : setup.trainable_parameters(model)) want.emplace(name, t);
  for (const SafetensorsEntry& e : st->entries())
    LT_CHECK_INPUT(want.count(e.name), file, ": tensor '", e.name,
                   "' does not belong to the adapter that adapter_config.json describes");
  NoGradGuard ng;
  for (const auto& [name, t] : setup.trainable_parameters(model)) {
    const SafetensorsEntry* e = st->find(name);
    LT_CHECK_INPUT(e != nullptr, file, ": tensor '", name, "' is missing");
    LT_CHECK_INPUT(e->shape == t.shape(), file, ": tensor '", name, "' has shape ",
                   shape_str(e->shape), ", the config and the model need ", shape_str(t.shape()));
    LT_CHECK_INPUT(dtype_is_floating(e->dtype), file, ": tensor '", name, "' has dtype ",
                   dtype_name(e->dtype), "; expected a float type");
    ops::copy(t, st->tensor(*e));
  }
}

PeftSetup load_adapter(const std::string& dir, DecoderModel& model, uint64_t seed) {
  PeftSetup s = attach(read_adapter_config(dir), model, seed);
  load_adapter_weights(s, model, dir);
  return s;
}

// ---------------------------------------------------------------- merging

std::vector<std::pair<std::string, Tensor>> merged_parameters(const PeftSetup& setup,
                                                              DecoderModel& model, DType dtype) {
  NoGradGuard ng;
  std::unordered_map<std::string, LinearModule*> linear;
  for (LinearModule* m : model.linear_modules()) linear.emplace(m->name + ".weight", m);
  std::unordered_map<const LinearModule*, const LoraAdapter*> lora;
  for (LinearModule* m : model.linear_modules())
    if (auto* a = dynamic_cast<const LoraAdapter*>(m->adapter.get())) lora.emplace(m, a);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : model.named_parameters()) {
    Tensor v = t;
    auto it = linear.find(name);
    const LinearModule* m = it == linear.end() ? nullptr : it->second;
    if (m && lora.count(m)) {
      const LoraAdapter* a = lora.at(m);
      const DType acc = a->lora_A().dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
      v = ops::add(m->dense_weight(acc), a->delta_weight(acc));
    } else if (m && !t.defined()) {
      v = m->dense_weight(dtype);
    } else if (name == kEmbedName && setup.tokens) {
      v = setup.tokens->merged(t);
    }
    LT_CHECK(v.defined(), "merged_parameters: no value for ", name);
    out.emplace_back(name, v.dtype() == dtype && v.device().is_cpu()
                               ? v.detach()
                               : v.detach().to(Device::cpu(), dtype, MemTag::kOther));
  }
  return out;
}

void save_merged(const PeftSetup& setup, DecoderModel& model, const std::string& dir,
                 DType disk_dtype, uint64_t max_shard_bytes) {
  std::filesystem::create_directories(dir);
  save_model_tensors(dir, merged_parameters(setup, model, disk_dtype), max_shard_bytes);
  ModelConfig cfg = model.config();
  cfg.torch_dtype = disk_dtype;
  cfg.save(dir);
}

}  // namespace leantune
