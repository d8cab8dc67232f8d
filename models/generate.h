// Generation with a KV cache, for batched prompts of different lengths.
//
// Prefill runs all prompts as one flat varlen batch and stores each layer's rotated K and V in
// the cache (MemTag::kKVCache; one region of prompt_len + max_new_tokens rows per sequence).
// Each decode step feeds one token per unfinished sequence; its attention reads that
// sequence's cache region. First repetition_penalty (transformers'
// RepetitionPenaltyLogitsProcessor: the logit of every token already in the prompt or the
// completion is divided by the penalty when positive, multiplied when negative). Greedy
// (temperature 0) then takes the first maximum, as torch.argmax; sampling applies temperature, then
// top_k, then top_p (the smallest set of most likely tokens whose probability reaches top_p, at
// least one), then min_p (tokens below min_p times the most likely one's probability dropped), in
// transformers' order, and draws with the Philox stream (seed, kSampling) of its own sequence
// number (first_sequence + its index in the call), so a prompt samples the same tokens in a batch
// as alone when given the same number. A sequence stops after
// an eos token (which is kept) or max_new_tokens.
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
  double min_p = 0.0;               // 0 = off
  double repetition_penalty = 1.0;  // 1 = off
  uint64_t seed = 0;
  // Sequence i of a call draws from Philox stream (seed, kSampling, first_sequence + i).
  int64_t first_sequence = 0;
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

// The distribution sampling draws from for one row of logits (host values): the kept tokens,
// most likely first, and their probabilities (summing to 1). `seen`: the tokens of the prompt
// and the completion so far, for repetition_penalty. With temperature 0, the greedy token alone.
struct SamplingDistribution {
  std::vector<int32_t> tokens;
  std::vector<double> probs;
};
SamplingDistribution sampling_distribution(std::vector<float> logits, const GenerationConfig& cfg,
                                           const std::vector<int32_t>& seen = {});
// Picks the next token from that distribution with one Philox draw; exposed for tests.
int32_t sample_token(const std::vector<float>& logits, const GenerationConfig& cfg, Generator& gen,
                     const std::vector<int32_t>& seen = {});

}  // namespace leantune
