// Hugging Face config.json -> ModelConfig, for LlamaForCausalLM and Qwen2ForCausalLM, and their
// *ForSequenceClassification variants (the decoder with a `score` head instead of lm_head;
// num_labels = len(id2label), else the num_labels key, else 2, as transformers reads it).
//
// Keys and defaults follow transformers' LlamaConfig / Qwen2Config, except that the keys that
// fix the model's shapes have no silent default here: hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads and vocab_size are required. Defaults:
//   num_key_value_heads = num_attention_heads; head_dim = hidden_size / num_attention_heads;
//   rope_theta = 10000; rms_norm_eps = 1e-6; initializer_range = 0.02;
//   tie_word_embeddings = false; max_position_embeddings = 2048 (llama) / 32768 (qwen2);
//   torch_dtype (or "dtype" in newer files) = float32; bos/pad absent; eos: int, list or absent.
// rope_scaling (or newer files' rope_parameters), keyed "rope_type" or legacy "type":
//   absent/null/"default"; "linear" (factor); "llama3" (factor, low_freq_factor,
//   high_freq_factor, original_max_position_embeddings). Other types are rejected.
// Biases: Llama reads attention_bias (q, k, v and o projections) and mlp_bias (default false).
// Qwen2 always has q/k/v biases and none on o_proj or the MLP, as transformers hardcodes;
// attention_bias = true and o_proj_bias = false describe that.
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

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM" | "Qwen2ForCausalLM" | "*ForSequenceClass."
  std::string model_type;    // "llama" | "qwen2"
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
          num_key_value_heads = 0, head_dim = 0, vocab_size = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, initializer_range = 0.02;
  kernels::RopeConfig rope;  // head_dim, theta and scaling
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // biases on q_proj, k_proj, v_proj
  bool o_proj_bias = false;     // bias on o_proj (llama: = attention_bias; qwen2: never)
  bool mlp_bias = false;        // biases on gate_proj, up_proj, down_proj
  std::optional<int64_t> bos_token_id, pad_token_id;
  std::vector<int64_t> eos_token_ids;
  DType torch_dtype = DType::kF32;
  nlohmann::json raw;  // the parsed file, written back (with updates) by save()

  // *ForSequenceClassification: the `score` head [num_labels, H], no lm_head.
  bool sequence_classification = false;
  int64_t num_labels = 0;  // sequence classification only

  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  // A config.json file, or a folder containing one.
  static ModelConfig load(const std::string& path_or_dir);
  // `raw` with the fields above written over it in transformers' key names.
  nlohmann::json to_json() const;
  void save(const std::string& dir) const;  // atomic dir/config.json
  // This config as the same decoder's *ForSequenceClassification with `num_labels` outputs.
  ModelConfig as_sequence_classification(int64_t num_labels) const;
  // Exact count from the shapes (tied head counted once; q/k/v bias for qwen2).
  int64_t num_parameters() const;
  std::string summary() const;  // one-paragraph human summary used by inspect
};

}  // namespace leantune
