// estimate --max_context --budget_gib N: the longest max_length whose estimated peak
// (trainers/estimate/estimate.h) fits a memory budget, found by search over the estimator itself,
// and the option changes that would lengthen it (each with the max_length it would give).
//
// The peak grows with the length within each tiling regime but may fall where sequence tiling
// starts (--tiled_mlp auto begins above kTilingAutoMinTokens tokens; any mode above one chunk),
// so the search runs in the untiled and the tiled lengths separately: the first tiled length is
// found by bisection (tiling, once on, stays on for longer sequences), and the longest fitting
// length by bisection inside the tiled range, or, when none of it fits, inside the untiled one.
// Estimates that overflow 64 bits count as not fitting. Lengths stop at kMaxContextTokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainers/estimate/estimate.h"

namespace leantune {

constexpr int64_t kMaxContextTokens = int64_t{1} << 36;

struct ContextFit {
  int64_t max_length = 0;  // 0: not even one token fits
  int64_t peak = 0;        // the estimated peak at max_length (bytes)
  int64_t tiling_chunk = 0;
  bool capped = false;  // max_length is kMaxContextTokens: longer ones were not tried
};

// `c` with micro-batches of `batch` sequences of `length` tokens.
EstimateConfig with_sequence_length(const EstimateConfig& c, int64_t batch, int64_t length);

// The longest length whose estimated peak is at most `limit` bytes.
ContextFit max_context(const EstimateConfig& c, int64_t batch, int64_t limit);

struct ContextOption {
  std::string what;  // the options as given on the command line
  ContextFit fit;
};

// Changes not already in `c` that would raise max_context: activation offloading, gradient
// checkpointing, sequence tiling, QLoRA (4-bit base with LoRA), smaller tiling chunks, and all of
// those together; only the ones whose max_length is longer than `base`.
std::vector<ContextOption> context_raising_options(const EstimateConfig& c, int64_t batch,
                                                   int64_t limit, const ContextFit& base);

}  // namespace leantune
