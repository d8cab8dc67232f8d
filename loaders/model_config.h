// Hugging Face config.json -> ModelConfig for the decoder families leantune runs:
//   LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM (qwen3),
//   MistralForCausalLM (mistral), Phi3ForCausalLM (phi3), Gemma3ForCausalLM (gemma3_text),
// and the *ForSequenceClassification variants of the first five (the decoder with a `score` head
// instead of lm_head; num_labels = len(id2label), else the num_labels key, else 2, as
// transformers reads it).
//
// One decoder runs them all; a family is a set of config-driven options (below), each read from
// the family's config keys with transformers' defaults for that family. The keys that fix the
// model's shapes have no silent default here: hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads and vocab_size are required. Common defaults: num_key_value_heads =
// num_attention_heads; rope_theta = 10000; rms_norm_eps = 1e-6 (phi3: 1e-5); initializer_range =
// 0.02; torch_dtype (or "dtype") = float32; bos/pad absent; eos: int, list or absent.
// Per family (transformers' config classes):
//   llama:   head_dim = hidden/heads; attention_bias (q, k, v and o), mlp_bias; max positions 2048.
//   qwen2:   q/k/v biases always, none on o_proj or the MLP; max positions 32768.
//   qwen3:   head_dim defaults to 128 (Qwen3Config's default, not hidden/heads); q_norm and
//            k_norm (RMSNorm over each head's head_dim before rope); attention_bias on q, k, v
//            and o; use_sliding_window + sliding_window + max_window_layers (or layer_types);
//            max positions 32768.
//   mistral: Llama without biases; sliding_window on every layer (default 4096 when the key is
//            absent, as MistralConfig; null = none); max positions 131072.
//   phi3:    fused qkv_proj [q; k; v] and gate_up_proj [gate; up]; sliding_window (default none);
//            partial_rotary_factor; rope_scaling "longrope" (alias "su"/"yarn") with short_factor,
//            long_factor and the top-level original_max_position_embeddings (default 4096);
//            resid_pdrop / embd_pdrop / attention_dropout must be 0; max positions 4096.
//   gemma3_text: RMSNorm applied as (1 + w) in f32; post-attention, pre- and post-feedforward
//            norms; q_norm/k_norm; GeGLU (hidden_activation gelu_pytorch_tanh); embeddings
//            scaled by sqrt(hidden); attention scale query_pre_attn_scalar^-0.5 (default 256);
//            layer_types or sliding_window_pattern (default 6: every 6th layer global) with
//            sliding_window (default 4096); global layers' rope from rope_theta (default 1e6) and
//            rope_scaling, sliding layers' from rope_local_base_freq (default 10000), or the
//            nested rope_parameters {full_attention, sliding_attention}; final_logit_softcapping
//            (null = off); attention_bias; head_dim 256 and tied embeddings by default; max
//            positions 131072. attn_logit_softcapping is not applied, as transformers' Gemma3
//            attention does not apply it (Gemma 2's does; the attention kernels support it).
// rope_scaling (or newer files' rope_parameters), keyed "rope_type" or legacy "type":
//   absent/null/"default"; "linear" (factor); "llama3" (factor, low_freq_factor,
//   high_freq_factor, original_max_position_embeddings); "longrope" (phi3 only). Other types are
//   rejected.
// hidden_act (gemma3: hidden_activation) must be the family's activation (silu; gelu_pytorch_tanh).
// Shape keys have upper limits far beyond any published model (num_hidden_layers 16384,
// hidden_size 2^20, intermediate_size 2^22, heads and head_dim 4096, max_position_embeddings
// 2^24, num_labels 2^20; vocab_size 2^31 - 1) so that every size derived from them fits in 64 bits.
// A null value counts as absent. The architecture comes from "architectures" (or from
// "model_type" when that list is missing). Every problem -- unknown architecture, missing
// required key, wrong type, inconsistent sizes -- is an Error of kind kInput that names the
// file and the key.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "kernels/rope.h"

namespace leantune {

// The MLP's gated activation: silu(gate) * up, or gelu_tanh(gate) * up.
enum class MlpActivation { kSilu, kGeluTanh };

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM", ..., "*ForSequenceClassification"
  std::string model_type;    // "llama" | "qwen2" | "qwen3" | "mistral" | "phi3" | "gemma3_text"
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
          num_key_value_heads = 0, head_dim = 0, vocab_size = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, initializer_range = 0.02;
  kernels::RopeConfig rope;  // head_dim, theta and scaling
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // biases on q_proj, k_proj, v_proj
  bool o_proj_bias = false;     // bias on o_proj (llama: = attention_bias; qwen2: never)
  bool mlp_bias = false;        // biases on gate_proj, up_proj, down_proj

  // The families' differences, as options of the one decoder (models/decoder.h).
  bool qk_norm = false;           // q_norm / k_norm over each head before rope (qwen3, gemma3)
  bool norm_unit_offset = false;  // RMSNorm weight applied as (1 + w), in f32 (gemma3)
  bool sandwich_norms = false;    // post-attention, pre- and post-feedforward norms (gemma3)
  bool fused_qkv = false;         // one qkv_proj [q; k; v] (phi3)
  bool fused_gate_up = false;     // one gate_up_proj [gate; up] (phi3)
  MlpActivation mlp_activation = MlpActivation::kSilu;
  bool scale_embeddings = false;  // embeddings * sqrt(hidden_size) in their dtype (gemma3)
  double attention_scale = 0;     // softmax scale; 0 = head_dim^-0.5
  int64_t sliding_window = 0;     // keys a sliding layer's query sees (itself included); 0 = none
  std::vector<bool> sliding_layers;  // per layer: restricted to sliding_window
  kernels::RopeConfig rope_local;    // the sliding layers' rope when it differs (gemma3)
  bool has_rope_local = false;
  double final_logit_softcapping = 0;  // logits = c * tanh(logits / c); 0 = off
  double attn_logit_softcapping = 0;   // the same on attention scores; 0 = off (no family sets
                                       // it yet: Gemma 3 ignores its key, as transformers does)
  std::optional<int64_t> bos_token_id, pad_token_id;
  std::vector<int64_t> eos_token_ids;
  DType torch_dtype = DType::kF32;
  nlohmann::json raw;  // the parsed file, written back (with updates) by save()

  // *ForSequenceClassification: the `score` head [num_labels, H], no lm_head.
  bool sequence_classification = false;
  int64_t num_labels = 0;  // sequence classification only

  // Layer l's attention: its sliding window (0 = none) and its rope.
  int64_t window_of(int64_t layer) const { return is_sliding_layer(layer) ? sliding_window : 0; }
  bool is_sliding_layer(int64_t layer) const {
    return static_cast<size_t>(layer) < sliding_layers.size() &&
           sliding_layers[static_cast<size_t>(layer)];
  }
  const kernels::RopeConfig& rope_of(int64_t layer) const {
    return has_rope_local && is_sliding_layer(layer) ? rope_local : rope;
  }
  // Elements of the normalisation weights of one decoder layer (2, or 4 with sandwich norms, of
  // hidden_size; q/k norms of head_dim).
  int64_t layer_norm_parameters() const;

  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  // A config.json file, or a folder containing one.
  static ModelConfig load(const std::string& path_or_dir);
  // `raw` with the fields above written over it in transformers' key names.
  nlohmann::json to_json() const;
  void save(const std::string& dir) const;  // atomic dir/config.json
  // This config as the same decoder's *ForSequenceClassification with `num_labels` outputs.
  ModelConfig as_sequence_classification(int64_t num_labels) const;
  // Exact count from the shapes (tied head counted once; biases, q/k and sandwich norms).
  int64_t num_parameters() const;
  std::string summary() const;  // one-paragraph human summary used by inspect

 private:
  void write_rope(nlohmann::json& j) const;
  void write_common(nlohmann::json& j) const;
};

}  // namespace leantune
