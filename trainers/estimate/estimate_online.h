// Memory estimate of an online run (trainer_bin estimate grpo|rloo|online_dpo ...), by phase:
//
//   generation  params + the reference's weights + the optimizer states (made by the first step,
//               kept from then on; gradients are freed after every step) + the KV-cache pool +
//               the largest generation step's transients.
//   optimizer   the policy's step as the SFT estimate walks it (trainers/estimate/estimate.h) over
//   one
//               micro-batch of prompt + completion sequences, + the reference's weights, + the
//               KV-cache pool unless vllm_enable_sleep_mode frees it between phases. Old and
//               reference log-probabilities are taken without gradient before the updates and
//               stay below the step's peak.
// The pool is what the trainer makes (models/kv_cache.h): kv_cache_blocks blocks of
// kv_block_size tokens, or, by default, a whole generation batch of U prompts x G generations at
// the longest prompt P with M new tokens (kv_blocks_for_prompt: ceil(P / bs) shared blocks, and
// per generation the blocks from the prompt's partial last one to its last fed token), each
// block 2 x layers x bs x Hkv x D elements.
// A generation step's transients are those of one decoder layer without gradient over the step's
// rows, plus the keys and values gathered from the pool for attention, plus the logits of each
// sequence's last row: the prefill step has U x P rows; a decode step has U x G rows and gathers
// up to U x G x (P + M - 1) keys and values, which is the larger in most runs.
// P: --prompt_length, or the longest prompt of --dataset (or of the built-in task) tokenized as
// the trainer tokenizes it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainers/estimate/estimate.h"

namespace leantune {

struct OnlineShape {
  int64_t prompts_per_generation = 1, num_generations = 2, prompt_length = 1, max_new_tokens = 1;
  int64_t kv_cache_blocks = 0, kv_block_size = 16;
  bool sleep_mode = false;
};

struct OnlineEstimate {
  EstimateConfig config;  // the policy step's inputs
  OnlineShape shape;
  MemoryEstimate policy;       // the optimizer phase's step
  std::string reference_mode;  // none, adapters_off, policy_copy, ref_model
  int64_t reference_params = 0;
  int64_t prompts_per_generation = 0;  // U (per rank)
  int64_t num_generations = 0;         // G
  int64_t prompt_length = 0;           // P
  int64_t max_new_tokens = 0;          // M
  int64_t kv_blocks = 0, kv_block_size = 0, kv_pool = 0;
  int64_t generation_workspace = 0;
  // distill --seq_kd: a batch the teacher samples holds its own pool (generate()'s pool for the
  // call, kCallKvBlockSize blocks for each prompt's tokens) and its generation transients.
  int64_t teacher_generation = 0;
  bool sleep_mode = false;
  int64_t generation_peak = 0, optimizer_peak = 0, peak = 0;
  std::string peak_phase;  // "generation" or the policy step's phase
  nlohmann::json to_json() const;
};

// The generation step's transients (see above) for a model in `dtype`.
int64_t generation_workspace_bytes(const ModelConfig& m, DType dtype, const OnlineShape& s);
// The KV-cache pool of `blocks` blocks of `block_size` tokens (models/kv_cache.h's layout).
// Both: OverflowError (engine/checked_int.h) for sizes past 2^63 bytes.
int64_t kv_pool_bytes(const ModelConfig& m, DType dtype, int64_t blocks, int64_t block_size);
OnlineEstimate estimate_online(const EstimateConfig& policy, const OnlineShape& shape,
                               const std::string& reference_mode, int64_t reference_params);

// The estimate's own options on top of online_options().
struct OnlineEstimateArguments {
  int64_t prompt_length = 0;  // 0: the longest prompt, measured
  EstimateRanks ranks;        // world_size
};
const OptionTable<OnlineEstimateArguments>& online_estimate_table();
void add_online_estimate_options(Options& o);
// From parsed options (those of online_options(algorithm) and add_online_estimate_options, with
// the demo defaults applied); path: the model folder or config.json.
OnlineEstimate estimate_online_from_options(const Options& o, const std::string& algorithm,
                                            const std::string& path, bool cpu);
int run_estimate_online(const std::vector<std::string>& args, const std::string& algorithm);

}  // namespace leantune
