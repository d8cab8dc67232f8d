// Generation with a KV cache, for batched prompts of different lengths.
//
// Prefill runs all prompts as one flat varlen batch and stores each layer's rotated K and V in
// the cache (MemTag::kKVCache; one region of prompt_len + max_new_tokens rows per sequence).
// Each decode step feeds one token per unfinished sequence; its attention reads that
// sequence's cache region. Greedy (temperature 0) takes the first maximum, as torch.argmax;
// sampling applies temperature, then top_k, then top_p (the smallest set of most likely tokens
// whose probability reaches top_p, at least one), and draws with the Philox stream
// (seed, kSampling). A sequence stops after an eos token (which is kept) or max_new_tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/rng.h"
#include "models/decoder.h"

namespace leantune {

struct GenerationConfig {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;
  uint64_t seed = 0;
  std::vector<int64_t> eos_token_ids;  // empty: the model config's
};

struct GenerationResult {
  std::vector<std::vector<int32_t>> tokens;  // new tokens per prompt (eos included when hit)
  std::vector<bool> finished_by_eos;
  int64_t kv_cache_bytes = 0;
};

GenerationResult generate(const DecoderModel& model,
                          const std::vector<std::vector<int32_t>>& prompts,
                          const GenerationConfig& cfg);

// Picks the next token from one row of logits (host values) per the config; exposed for tests.
int32_t sample_token(const std::vector<float>& logits, const GenerationConfig& cfg, Generator& gen);

}  // namespace leantune
