// PEFT LoRA on a DecoderModel: which modules get adapters, the trainable-tensor set, and the
// adapter files in PEFT's format (adapter_config.json + adapter_model.safetensors), loadable by
// PEFT (PeftModel.from_pretrained) and vLLM, and readable from adapters PEFT wrote.
//
// Module selection follows PEFT (tuners_utils.check_target_module_exists, other._set_trainable):
//   - target_modules: a module is targeted when its name equals an entry or ends with
//     "." + entry; ["all-linear"] means every linear layer except the output head; empty means
//     PEFT's per-architecture default (q_proj, v_proj for llama, qwen2, qwen3, mistral and
//     gemma3_text; phi3 has none, as in PEFT). Phi-3's fused qkv_proj and gate_up_proj are
//     targeted by those names, one adapter over the fused output, as PEFT sees them. A single entry
//     read from a PEFT file as a JSON string (not a list) is a regular expression matched against
//     the whole module name, as in PEFT. Every list entry must match some linear layer (PEFT
//     only requires one match overall; per entry catches typos). LoRA on lm_head or on the
//     embedding is rejected (the head is applied by the fused loss, not by a LinearModule).
//   - modules_to_save: a module (a parameter name without ".weight"/".bias") is trained whole
//     when its name ends with an entry (PEFT's plain suffix test); such modules get no LoRA.
//   - trainable_token_indices: models/trainable_tokens.h.
//   - task_type SEQ_CLS (read from a file): "score" joins modules_to_save and "classifier" is
//     dropped from it, as PEFT adds both head names for sequence classification.
// Everything else is frozen: no gradient, no optimizer state.
//
// Files (PEFT's save_and_load): keys carry the "base_model.model." prefix and no adapter name:
//   base_model.model.<module>.lora_A.weight [r, in], ...lora_B.weight [out, r]
//   base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta [n, H]
//   base_model.model.<parameter name> for modules_to_save (PEFT strips
//   "modules_to_save.<adapter>." when saving)
// in the parameters' dtype (f64 written as f32), metadata {"format": "pt"}. adapter_config.json
// holds the full field set PEFT 0.21.2 writes (tests/fixtures/peft/*/peft_adapter/), with
// target_modules as the sorted list of entries (all-linear expanded to the layer kinds).
// Loading is strict: a key the setup does not consume, a missing key or a shape that disagrees
// with the config is an Error naming the file and the key; configs using PEFT features this
// engine does not implement (DoRA, LoRA biases, layers_to_transform, ...) are rejected by name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "models/decoder.h"
#include "models/lora.h"
#include "models/trainable_tokens.h"

namespace leantune {

struct PeftConfig {
  int64_t r = 16;
  double lora_alpha = 32;
  double lora_dropout = 0.05;
  std::vector<std::string> target_modules;  // empty: the architecture's default
  std::string target_regex;                 // set instead of target_modules by PEFT files
  bool use_rslora = false;
  std::vector<std::string> modules_to_save;
  std::vector<int64_t> trainable_token_indices;
  // PEFT's task_type: CAUSAL_LM, or SEQ_CLS for a sequence classifier (reward model), whose
  // `score` head is then in modules_to_save as PeftModelForSequenceClassification puts it.
  std::string task_type = "CAUSAL_LM";
  // Per-module overrides (keys are PEFT patterns: "(.*\.)?(key)$" on the module name).
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
};

// The name prefix PEFT gives every key of a causal-LM adapter file.
inline constexpr const char* kPeftKeyPrefix = "base_model.model.";
inline constexpr const char* kTrainableTokensKey =
    "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta";

struct PeftSetup {
  PeftConfig config;
  std::vector<std::shared_ptr<LoraAdapter>> adapters;  // in the model's module order
  std::shared_ptr<TrainableTokens> tokens;             // null without trainable tokens
  std::vector<std::string> saved_modules;              // parameter names trained whole
  std::shared_ptr<LoraRuntime> runtime;                // null: no PEFT (full training)

  bool active() const { return runtime != nullptr; }
  // Every trainable tensor under its adapter-file key (the names optimizer state is saved
  // under), in PEFT's order: trainable tokens, LoRA A/B per module, modules_to_save.
  std::vector<std::pair<std::string, Tensor>> trainable_parameters(const DecoderModel& model) const;
  int64_t num_trainable_parameters(const DecoderModel& model) const;
  // Dropout on (training) or off (evaluation, generation).
  void set_training(bool on);
  // Off: the base model alone, for a reference-model forward (DPO without ref_model). Errors
  // when modules_to_save is used, since those modules are trained in place.
  void set_adapters_enabled(bool on);
  // The sorted, unique target_modules written to adapter_config.json.
  std::vector<std::string> config_target_modules() const;
};

// Adapter dropout off for its lifetime (evaluation, generation, no-grad scoring passes), the
// previous mode restored after, also when an error leaves the scope.
class AdapterEvalScope {
 public:
  explicit AdapterEvalScope(PeftSetup& peft)
      : peft_(peft), was_training_(peft.active() && peft.runtime->training) {
    if (peft_.active()) peft_.set_training(false);
  }
  ~AdapterEvalScope() {
    if (peft_.active()) peft_.set_training(was_training_);
  }
  AdapterEvalScope(const AdapterEvalScope&) = delete;
  AdapterEvalScope& operator=(const AdapterEvalScope&) = delete;

 private:
  PeftSetup& peft_;
  bool was_training_;
};

// Freezes every parameter of `model`, then attaches LoRA adapters, trainable tokens and
// modules_to_save per `cfg`. LoRA A is drawn from (seed, kLoraInit), B = 0; dropout draws from
// (seed, kDropout), registered for checkpoint replay. Error(kInput) naming the option when the
// config selects nothing or something unsupported.
PeftSetup apply_peft(const PeftConfig& cfg, DecoderModel& model, uint64_t seed);
// Removes every adapter and override (the model is then the plain frozen base).
void remove_peft(DecoderModel& model);

// adapter_config.json content for `setup`.
nlohmann::json adapter_config_json(const PeftSetup& setup,
                                   const std::string& base_model_name_or_path);
// Writes dir/adapter_model.safetensors and dir/adapter_config.json (atomically; dir created).
void save_adapter(const PeftSetup& setup, const DecoderModel& model, const std::string& dir,
                  const std::string& base_model_name_or_path);

// True when dir holds adapter_config.json.
bool is_adapter_dir(const std::string& dir);
// Parses an adapter_config.json (a folder or the file). base_model_name_or_path, when asked
// for, receives the field's value ("" when absent or null).
PeftConfig read_adapter_config(const std::string& path,
                               std::string* base_model_name_or_path = nullptr);
// Copies the tensors of dir/adapter_model.safetensors into an existing setup (resuming).
void load_adapter_weights(const PeftSetup& setup, const DecoderModel& model,
                          const std::string& dir);
// read_adapter_config + apply_peft + load_adapter_weights. The adapters are trainable (call
// set_training(false) for generation).
PeftSetup load_adapter(const std::string& dir, DecoderModel& model, uint64_t seed = 0);

// The model's parameters with the adapters folded in: W + scaling B A for adapted layers
// (quantized bases dequantized), the trainable-token rows written into embed_tokens, in
// `dtype`, under the HF names (what DecoderModel::save writes for the merged model).
std::vector<std::pair<std::string, Tensor>> merged_parameters(const PeftSetup& setup,
                                                              DecoderModel& model, DType dtype);
// Writes the merged model as an HF folder (config.json + model.safetensors, sharded when
// max_shard_bytes > 0).
void save_merged(const PeftSetup& setup, DecoderModel& model, const std::string& dir,
                 DType disk_dtype, uint64_t max_shard_bytes = 0);

}  // namespace leantune
