// Generation for training and for `trainer_bin generate`: batched prompts of different lengths
// over a paged KV cache (models/kv_cache.h), with continuous batching and prefix sharing.
//
// Scheduling, vLLM's way:
// - Identical prompts in a call form a group: the prompt is prefilled once, its blocks are shared
//   by the group's generations, and a block is copied before a generation writes into it while
//   shared (the prompt's last, partial block).
// - Admission is first come first served: a generation enters when the pool can promise it every
//   block it may need (kv_blocks_for_prompt), so nothing is ever preempted. A pool smaller than
//   the call runs as many generations at once as it holds; one that cannot hold a single
//   generation is an Error(kInput) saying how many blocks it needs.
// - Each step is one flat batch: the prefills of newly admitted groups and one token for every
//   running generation. The new K/V rows go to the pool (kernels/kv_cache_write.h); every
//   sequence's keys are then gathered from its blocks into one varlen attention call. A finished
//   generation's blocks go back at once, and waiting ones are admitted in the next step.
// Sampling: first repetition_penalty (transformers' RepetitionPenaltyLogitsProcessor: the logit of
// every token already in the prompt or the completion is divided by the penalty when positive,
// multiplied when negative). Greedy (temperature 0) then takes the first maximum, as
// torch.argmax; sampling applies temperature, then top_k, then top_p (the smallest set of most
// likely tokens whose probability reaches top_p, at least one), then min_p (tokens below min_p
// times the most likely one's probability dropped), in transformers' order, and draws with the
// Philox stream (seed, kSampling) of its own sequence number (first_sequence + its index in the
// call). Every sequence's rows are computed independently of the others in its step, so a prompt
// gets the same tokens in any batch, pool size or admission order as alone with the same number.
// A sequence stops after an eos token (which is kept) or max_new_tokens. GenerationConfig's
// should_stop is asked between steps, so that a trainer honours a stop signal within one step.
// Longrope (Phi-3): a generation whose positions grow past original_max_position_embeddings is
// recomputed whole with the long factors at that step (its prompt's blocks made private first), as
// transformers' Phi-3 drops its cache there; its reservation counts those blocks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/rng.h"
#include "models/decoder.h"
#include "models/kv_cache.h"

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
  // Asked before every step; true ends the call at once with `interrupted` set (a trainer's stop
  // signal). Empty: never.
  std::function<bool()> should_stop;
};

struct GenerationResult {
  std::vector<std::vector<int32_t>> tokens;  // new tokens per prompt (eos included when hit)
  std::vector<bool> finished_by_eos;
  int64_t kv_cache_bytes = 0;  // the pool's bytes
  bool interrupted = false;    // should_stop ended the call: the tokens are incomplete
};

// The block size of the pool generate() makes for a call when it is given none.
inline constexpr int64_t kCallKvBlockSize = 16;

// `pool`: the KV-cache pool to use (the online trainers keep one between generation phases and
// may put it to sleep); nullptr: one of block size 16 sized for the whole call, freed at the end.
// The pool's blocks are all free again when the call returns.
GenerationResult generate(const DecoderModel& model,
                          const std::vector<std::vector<int32_t>>& prompts,
                          const GenerationConfig& cfg, PagedKVCache* pool = nullptr);

// The blocks that let a call run every generation at once: kv_blocks_for_prompt summed over the
// groups of identical prompts (at least 1).
int64_t kv_blocks_for_call(const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
                           int64_t block_size);

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
