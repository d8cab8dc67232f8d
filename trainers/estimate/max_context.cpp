// The search behind estimate --max_context (trainers/estimate/max_context.h).
#include "trainers/estimate/max_context.h"

#include <algorithm>
#include <functional>

#include "engine/checked_int.h"
#include "engine/tiled.h"

namespace leantune {
namespace {

int64_t peak_or_overflow(const EstimateConfig& c) {
  try {
    return estimate_memory(c).peak;
  } catch (const OverflowError&) {
    return INT64_MAX;
  }
}

// The largest x in [lo, hi] with pred(x), for pred true up to some point and false after;
// lo - 1 when pred(lo) is false.
int64_t last_true(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& pred) {
  if (lo > hi || !pred(lo)) return lo - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (pred(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace

EstimateConfig with_sequence_length(const EstimateConfig& c, int64_t batch, int64_t length) {
  EstimateConfig r = c;
  r.micro_batch_tokens = (CheckedInt(batch) * length).get();
  r.max_seqlen = length;
  r.attention_seqlen = 0;
  return r;
}

ContextFit max_context(const EstimateConfig& c, int64_t batch, int64_t limit) {
  const int64_t cap = kMaxContextTokens;
  auto tiled = [&](int64_t len) {
    try {
      return tiling_chunk_tokens(c.tiling, c.model,
                                 rank_tokens(with_sequence_length(c, batch, len))) > 0;
    } catch (const OverflowError&) {
      return true;
    }
  };
  auto fits = [&](int64_t len) {
    try {
      return peak_or_overflow(with_sequence_length(c, batch, len)) <= limit;
    } catch (const OverflowError&) {
      return false;
    }
  };
  // The first tiled length: tiled(len) is false up to some length and true after it.
  const int64_t first_tiled = last_true(1, cap, [&](int64_t len) { return !tiled(len); }) + 1;
  int64_t best = first_tiled <= cap ? last_true(first_tiled, cap, fits) : first_tiled - 1;
  if (best < first_tiled) best = last_true(1, std::min(first_tiled - 1, cap), fits);
  ContextFit f;
  f.max_length = std::max<int64_t>(best, 0);
  f.capped = best == cap;
  if (f.max_length > 0) {
    const MemoryEstimate e = estimate_memory(with_sequence_length(c, batch, f.max_length));
    f.peak = e.peak;
    f.tiling_chunk = e.tiling_chunk;
  }
  return f;
}

std::vector<ContextOption> context_raising_options(const EstimateConfig& c, int64_t batch,
                                                   int64_t limit, const ContextFit& base) {
  std::vector<ContextOption> out;
  EstimateConfig all = c;
  std::string all_what;
  auto consider = [&](const std::string& what, const std::function<void(EstimateConfig&)>& set) {
    EstimateConfig v = c;
    set(v);
    set(all);
    all_what += (all_what.empty() ? "" : " ") + what;
    const ContextFit f = max_context(v, batch, limit);
    if (f.max_length > base.max_length) out.push_back({what, f});
  };
  if (!c.activation_offloading)
    consider("--activation_offloading", [](EstimateConfig& v) { v.activation_offloading = true; });
  if (!c.gradient_checkpointing)
    consider("--gradient_checkpointing",
             [](EstimateConfig& v) { v.gradient_checkpointing = true; });
  if (c.tiling.mode != TilingMode::kOn)
    consider("--tiled_mlp true", [](EstimateConfig& v) { v.tiling.mode = TilingMode::kOn; });
  if (!c.load_in_4bit || !c.use_peft)
    consider("--use_peft --load_in_4bit", [](EstimateConfig& v) {
      v.use_peft = v.load_in_4bit = true;
      v.load_in_8bit = false;
    });
  // Smaller blocks of the tiled layers: halve the chunk in use (or the default one) twice.
  const int64_t chunk =
      c.tiling.chunk_tokens > 0 ? c.tiling.chunk_tokens : default_tiling_chunk(c.model);
  for (int64_t div : {2, 4}) {
    const int64_t smaller = tiled_chunk_rows(chunk / div);
    if (smaller >= chunk) break;
    ContextOption o{"--tiled_mlp true --tiled_mlp_chunk_size " + std::to_string(smaller), {}};
    EstimateConfig v = c;
    v.tiling = {TilingMode::kOn, smaller};
    o.fit = max_context(v, batch, limit);
    if (o.fit.max_length > base.max_length) out.push_back(o);
  }
  if (out.size() > 1) {
    const ContextFit f = max_context(all, batch, limit);
    if (f.max_length > base.max_length) out.push_back({all_what, f});
  }
  return out;
}

}  // namespace leantune
