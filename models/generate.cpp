// Generation over the paged KV cache: scheduling, prefill, decode and sampling (see generate.h).
#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>

#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "engine/ops.h"
#include "engine/rng.h"
#include "kernels/attention.h"
#include "kernels/kv_cache_write.h"
#include "kernels/rope.h"

namespace leantune {

SamplingDistribution sampling_distribution(std::vector<float> logits, const GenerationConfig& cfg,
                                           const std::vector<int32_t>& seen) {
  const int64_t v = static_cast<int64_t>(logits.size());
  LT_CHECK(v > 0, "sampling from empty logits");
  LT_CHECK(cfg.repetition_penalty > 0 && cfg.min_p >= 0 && cfg.min_p <= 1 && cfg.top_p > 0,
           "generation: repetition_penalty ", cfg.repetition_penalty, ", min_p ", cfg.min_p,
           ", top_p ", cfg.top_p);
  if (cfg.repetition_penalty != 1.0) {
    std::vector<char> done(static_cast<size_t>(v), 0);
    for (int32_t t : seen) {
      if (t < 0 || t >= v || done[t]) continue;
      done[t] = 1;
      float& z = logits[t];
      z = z < 0 ? static_cast<float>(z * cfg.repetition_penalty)
                : static_cast<float>(z / cfg.repetition_penalty);
    }
  }
  SamplingDistribution d;
  if (cfg.temperature <= 0.0) {
    d.tokens = {
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    d.probs = {1.0};
    return d;
  }
  std::vector<int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = v;
  if (cfg.top_k > 0) keep = std::min(keep, cfg.top_k);
  std::vector<double> p(keep);
  const double mx = logits[order[0]] / cfg.temperature;
  double z = 0;
  for (int64_t i = 0; i < keep; ++i) {
    p[i] = std::exp(logits[order[i]] / cfg.temperature - mx);
    z += p[i];
  }
  for (double& x : p) x /= z;
  auto renormalise = [&](int64_t n) {
    keep = std::max<int64_t>(n, 1);
    p.resize(keep);
    const double s = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& x : p) x /= s;
  };
  if (cfg.top_p < 1.0) {
    double c = 0;
    int64_t n = 0;
    while (n < keep) {
      c += p[n++];
      if (c >= cfg.top_p) break;
    }
    renormalise(n);
  }
  if (cfg.min_p > 0.0) {
    const double floor = cfg.min_p * p[0];
    int64_t n = 0;
    while (n < keep && p[n] >= floor) ++n;
    renormalise(n);
  }
  d.tokens.assign(order.begin(), order.begin() + keep);
  d.probs = std::move(p);
  return d;
}

int32_t sample_token(const std::vector<float>& logits, const GenerationConfig& cfg, Generator& gen,
                     const std::vector<int32_t>& seen) {
  const SamplingDistribution d = sampling_distribution(logits, cfg, seen);
  if (cfg.temperature <= 0.0) return d.tokens[0];  // greedy draws nothing
  const PhiloxBlock b = gen.next_block();
  const double u = (static_cast<double>(b.w[0]) * 4294967296.0 + b.w[1]) / 18446744073709551616.0;
  double c = 0;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    c += d.probs[i];
    if (u < c) return d.tokens[i];
  }
  return d.tokens.back();
}

namespace {

// A run of identical prompts: prefilled once, its blocks shared by its generations.
struct PromptGroup {
  const std::vector<int32_t>* prompt = nullptr;
  std::vector<int64_t> members;  // indices of the call's prompts, in order
  size_t admitted = 0;           // members admitted so far
  int64_t live = 0;              // admitted members not yet finished
  std::vector<int32_t> table;    // the prompt's blocks (held until the group is done)
  bool prefilled = false;
  std::vector<float> logits;  // the prompt's last-row logits, kept for members admitted later
  int64_t reserved = 0;       // the group's own reservation: its prompt blocks
};

// One generation being decoded.
struct Running {
  int64_t index = 0;  // into the call's prompts
  int64_t group = 0;
  std::vector<int32_t> table;
  int64_t length = 0;  // positions with K/V in the cache
  int32_t next = -1;   // the token to feed at position `length`
  int64_t reserved = 0;
};

// What attends in one step: `rows` new tokens from position `start`, reading `start + rows` keys
// through `table`.
struct StepEntry {
  const std::vector<int32_t>* table;
  int64_t start, rows;
};

int64_t slot_of(const std::vector<int32_t>& table, int64_t pos, int64_t bs) {
  return int64_t{table[static_cast<size_t>(pos / bs)]} * bs + pos % bs;
}

// The decoder over one step's flat rows, each layer as DecoderModel::layer_forward_with runs it in
// training, with this attention step: rope at each row's position (longrope choosing its factors
// per entry, by the entry's largest position, as transformers does for a sequence alone), the new
// K/V rows written to the pool, then every entry attending over its whole cached sequence,
// gathered from the pool, in one varlen attention call with the layer's window and soft-cap.
Tensor forward_step(const DecoderModel& m, PagedKVCache& pool, const std::vector<int64_t>& ids,
                    const std::vector<int64_t>& positions, const std::vector<StepEntry>& entries) {
  const ModelConfig& c = m.config();
  const Device dev = m.device();
  const int64_t t = static_cast<int64_t>(ids.size()), d = c.head_dim, nkv = c.num_key_value_heads,
                bs = pool.block_size();
  std::vector<int64_t> write, read;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  int64_t max_q = 0, max_k = 0;
  for (const StepEntry& e : entries) {
    for (int64_t p = e.start; p < e.start + e.rows; ++p) write.push_back(slot_of(*e.table, p, bs));
    for (int64_t p = 0; p < e.start + e.rows; ++p) read.push_back(slot_of(*e.table, p, bs));
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(e.rows));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(e.start + e.rows));
    max_q = std::max(max_q, e.rows);
    max_k = std::max(max_k, e.start + e.rows);
  }
  const int64_t tk = static_cast<int64_t>(read.size());
  const Tensor wslots = Tensor::from_vector(write, {t});
  const Tensor rslots = Tensor::from_vector(read, {tk}, dev);
  const Tensor tcu_q = Tensor::from_vector(cu_q, {static_cast<int64_t>(cu_q.size())}, dev);
  const Tensor tcu_k = Tensor::from_vector(cu_k, {static_cast<int64_t>(cu_k.size())}, dev);
  const Tensor tpos = Tensor::from_vector(positions, {t}, dev);
  // Rope of one step: whole when every entry makes the same longrope choice (always, without
  // longrope), else entry by entry.
  auto rope = [&](int64_t l, const Tensor& x) {
    const kernels::RopeConfig& rc = c.rope_of(l);
    bool uniform = rc.scaling_type != "longrope";
    if (!uniform) {
      uniform = true;
      for (const StepEntry& e : entries)
        uniform = uniform && rc.long_for(e.start + e.rows - 1) ==
                                 rc.long_for(entries.front().start + entries.front().rows - 1);
    }
    if (uniform) {
      const StepEntry& e0 = entries.front();
      return m.apply_rope(l, x, tpos, e0.start + e0.rows - 1);
    }
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    for (size_t i = 0; i < entries.size(); ++i) {
      const StepEntry& e = entries[i];
      const int64_t r0 = cu_q[i];
      ops::copy(out.narrow(0, r0, e.rows),
                m.apply_rope(l, x.narrow(0, r0, e.rows).contiguous(), tpos.narrow(0, r0, e.rows),
                             e.start + e.rows - 1));
    }
    return out;
  };
  auto attend = [&](int64_t l, const Tensor& q, const Tensor& k, const Tensor& v) {
    const Tensor qr = rope(l, q), kr = rope(l, k);
    kernels::kv_cache_write(pool.k(l), wslots, kr.reshape({t, nkv * d}));
    kernels::kv_cache_write(pool.v(l), wslots, v.reshape({t, nkv * d}));
    const Tensor kk = ops::index_rows(pool.k(l), rslots).view({tk, nkv, d});
    const Tensor vv = ops::index_rows(pool.v(l), rslots).view({tk, nkv, d});
    kernels::AttentionOptions ao = m.attention_options(l);
    ao.max_seqlen_q = max_q;
    ao.max_seqlen_k = max_k;
    return kernels::attention(qr, kk, vv, tcu_q, tcu_k, ao).out;
  };
  Tensor h = m.embed(Tensor::from_vector(ids, {t}, dev));
  for (int64_t l = 0; l < m.num_layers(); ++l) h = m.layer_forward_with(l, h, attend);
  // Only each entry's last row needs logits.
  std::vector<int64_t> last;
  for (size_t i = 1; i < cu_q.size(); ++i) last.push_back(cu_q[i] - 1);
  const Tensor rows =
      ops::index_rows(h, Tensor::from_vector(last, {static_cast<int64_t>(last.size())}, dev));
  ParamUse use(m.param_residency(), ParamResidency::kOuterUnit);
  return m.logits(m.final_norm_forward(rows));
}

}  // namespace

int64_t kv_blocks_for_call(const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
                           int64_t block_size) {
  std::map<std::vector<int32_t>, int64_t> count;
  for (const auto& p : prompts)
    if (!p.empty()) ++count[p];
  int64_t blocks = 0;
  for (const auto& [p, n] : count)
    blocks += kv_blocks_for_prompt(static_cast<int64_t>(p.size()), n, max_new_tokens, block_size);
  return std::max<int64_t>(blocks, 1);
}

GenerationResult generate(const DecoderModel& model,
                          const std::vector<std::vector<int32_t>>& prompts,
                          const GenerationConfig& cfg, PagedKVCache* pool_in) {
  NoGradGuard ng;
  MemPhaseGuard phase(MemPhaseKind::kGeneration);
  MemTagGuard tag(MemTag::kKVCache);
  // A row's bits must not depend on the rows beside it (engine/ops.h).
  ops::BatchInvariantGemmGuard invariant;
  const ModelConfig& c = model.config();
  const int64_t b = static_cast<int64_t>(prompts.size());
  GenerationResult res;
  res.tokens.resize(b);
  res.finished_by_eos.assign(b, false);
  if (b == 0) return res;
  const std::vector<int64_t> eos = cfg.eos_token_ids.empty() ? c.eos_token_ids : cfg.eos_token_ids;
  for (const auto& p : prompts) {
    LT_CHECK_INPUT(!p.empty(), "generate: an empty prompt");
    for (int32_t id : p)
      LT_CHECK_INPUT(id >= 0 && id < c.vocab_size, "generate: token id ", id,
                     " outside the vocabulary (", c.vocab_size, ")");
  }
  const int64_t max_new = std::max<int64_t>(cfg.max_new_tokens, 0);
  if (max_new == 0) return res;
  // One stream per sequence (the generator's rank field carries the sequence number): what a
  // sequence draws does not depend on the others in the batch.
  LT_CHECK_INPUT(cfg.first_sequence >= 0 && cfg.first_sequence + b <= int64_t{UINT32_MAX},
                 "generate: sequence numbers ", cfg.first_sequence, " .. ", cfg.first_sequence + b,
                 " outside the 32-bit stream range");
  std::vector<Generator> gens;
  for (int64_t s = 0; s < b; ++s)
    gens.emplace_back(cfg.seed, RngPurpose::kSampling,
                      static_cast<uint32_t>(cfg.first_sequence + s));

  // Longrope (Phi-3): a generation whose positions grow past original_max_position_embeddings
  // is recomputed whole with the long factors at that step, as transformers' Phi-3 drops its cache
  // there; it then needs its prompt's full blocks privately (recrossing(P): those extra blocks).
  const kernels::RopeConfig& rope = c.rope;
  auto crosses = [&](int64_t prompt_len) {
    return rope.scaling_type == "longrope" && !rope.long_for(prompt_len - 1) &&
           rope.long_for(prompt_len + max_new - 2);
  };
  auto recrossing = [&](int64_t prompt_len, int64_t bs) {
    return crosses(prompt_len) ? prompt_len / bs : 0;
  };
  std::unique_ptr<PagedKVCache> own_pool;
  if (pool_in == nullptr) {
    const int64_t bs = kCallKvBlockSize;
    int64_t blocks = kv_blocks_for_call(prompts, max_new, bs);
    for (const auto& p : prompts) blocks += recrossing(static_cast<int64_t>(p.size()), bs);
    own_pool = std::make_unique<PagedKVCache>(c, model.num_layers(), model.dtype(), model.device(),
                                              bs, blocks);
  }
  PagedKVCache& pool = pool_in ? *pool_in : *own_pool;
  pool.wake();
  LT_CHECK(pool.free_blocks() == pool.num_blocks(), "generate: the kv cache has ",
           pool.num_blocks() - pool.free_blocks(), " blocks still in use");
  const int64_t bs = pool.block_size();
  res.kv_cache_bytes = pool.bytes();

  // Prefix sharing: identical prompts form one group, in order of first appearance.
  std::vector<PromptGroup> groups;
  {
    std::map<std::vector<int32_t>, size_t> by_prompt;
    for (int64_t s = 0; s < b; ++s) {
      auto [it, fresh] = by_prompt.emplace(prompts[s], groups.size());
      if (fresh) {
        groups.emplace_back();
        groups.back().prompt = &prompts[s];
      }
      groups[it->second].members.push_back(s);
    }
  }
  auto own_blocks = [&](const PromptGroup& g) {
    const int64_t p = static_cast<int64_t>(g.prompt->size());
    return kv_blocks_for_prompt(p, 1, max_new, bs) - kv_blocks_for_prompt(p, 0, max_new, bs) +
           recrossing(p, bs);
  };
  int64_t reserved = 0;  // blocks promised to admitted groups and generations
  std::vector<Running> running;
  size_t next_group = 0;  // groups before it have admitted every member

  // Appends the sampled token; returns whether the generation goes on.
  auto take = [&](Running& r, const float* logits, int64_t vsz) {
    std::vector<int32_t> seen;
    if (cfg.repetition_penalty != 1.0) {
      seen = prompts[r.index];
      seen.insert(seen.end(), res.tokens[r.index].begin(), res.tokens[r.index].end());
    }
    const int32_t tok = sample_token(std::vector<float>(logits, logits + vsz), cfg,
                                     gens[static_cast<size_t>(r.index)], seen);
    res.tokens[r.index].push_back(tok);
    if (std::find(eos.begin(), eos.end(), tok) != eos.end()) {
      res.finished_by_eos[r.index] = true;
      return false;
    }
    r.next = tok;
    return static_cast<int64_t>(res.tokens[r.index].size()) < max_new;
  };
  auto finish = [&](Running& r) {
    for (int32_t blk : r.table) pool.release(blk);
    reserved -= r.reserved;
    PromptGroup& g = groups[static_cast<size_t>(r.group)];
    if (--g.live == 0 && g.admitted == g.members.size()) {
      for (int32_t blk : g.table) pool.release(blk);
      g.table.clear();
      g.logits.clear();
      reserved -= g.reserved;
    }
  };
  // A new generation of a prefilled group: shares the prompt's blocks, samples its first token.
  std::vector<Running> started;
  auto start = [&](int64_t gi, int64_t member) {
    PromptGroup& g = groups[static_cast<size_t>(gi)];
    Running r;
    r.index = member;
    r.group = gi;
    r.table = g.table;
    for (int32_t blk : r.table) pool.retain(blk);
    r.length = static_cast<int64_t>(g.prompt->size());
    r.reserved = own_blocks(g);
    if (take(r, g.logits.data(), static_cast<int64_t>(g.logits.size())))
      started.push_back(std::move(r));
    else
      finish(r);
  };

  while (true) {
    if (cfg.should_stop && cfg.should_stop()) {
      // Every block back to the pool: the running generations' own, then the groups' prompts.
      for (Running& r : running)
        for (int32_t blk : r.table) pool.release(blk);
      for (PromptGroup& g : groups)
        for (int32_t blk : g.table) pool.release(blk);
      res.interrupted = true;
      return res;
    }
    // Admission, first come first served: a group's prompt blocks when its first member comes
    // in, then each member's own blocks, while the pool can promise them.
    std::vector<std::pair<int64_t, int64_t>> admitted;  // (group, member)
    while (next_group < groups.size()) {
      PromptGroup& g = groups[next_group];
      const int64_t need =
          own_blocks(g) +
          (g.admitted == 0
               ? kv_blocks_for_prompt(static_cast<int64_t>(g.prompt->size()), 0, max_new, bs)
               : 0);
      if (reserved + need > pool.num_blocks()) {
        LT_CHECK_INPUT(reserved > 0, "generate: a kv cache of ", pool.num_blocks(), " blocks of ",
                       bs, " tokens cannot hold one completion of a ", g.prompt->size(),
                       "-token prompt with ", max_new, " new tokens (it needs ", need, " blocks)");
        break;
      }
      if (g.admitted == 0) {
        g.reserved = need - own_blocks(g);
        const int64_t nb = (static_cast<int64_t>(g.prompt->size()) + bs - 1) / bs;
        for (int64_t i = 0; i < nb; ++i) g.table.push_back(pool.allocate());
      }
      reserved += need;
      ++g.live;
      admitted.emplace_back(static_cast<int64_t>(next_group), g.members[g.admitted++]);
      if (g.admitted == g.members.size()) ++next_group;
    }
    // Members of groups prefilled earlier start at once.
    started.clear();
    std::vector<int64_t> prefill;  // groups to prefill this step
    std::vector<std::pair<int64_t, int64_t>> after_prefill;
    for (const auto& [gi, member] : admitted) {
      PromptGroup& g = groups[static_cast<size_t>(gi)];
      if (g.prefilled) {
        start(gi, member);
      } else {
        if (prefill.empty() || prefill.back() != gi) prefill.push_back(gi);
        after_prefill.emplace_back(gi, member);
      }
    }
    // The step: prefills, then one token for every running generation.
    std::vector<int64_t> ids, positions;
    std::vector<StepEntry> entries;
    for (int64_t gi : prefill) {
      const PromptGroup& g = groups[static_cast<size_t>(gi)];
      for (size_t j = 0; j < g.prompt->size(); ++j) {
        ids.push_back((*g.prompt)[j]);
        positions.push_back(static_cast<int64_t>(j));
      }
      entries.push_back({&g.table, 0, static_cast<int64_t>(g.prompt->size())});
    }
    for (Running& r : running) {
      // The block the new token goes to: a fresh one at a block boundary, a private copy of a
      // shared one (copy on write).
      const size_t bi = static_cast<size_t>(r.length / bs);
      if (bi == r.table.size()) {
        r.table.push_back(pool.allocate());
      } else if (pool.refcount(r.table[bi]) > 1) {
        const int32_t fresh = pool.allocate();
        pool.copy_block(fresh, r.table[bi], r.length % bs);
        pool.release(r.table[bi]);
        r.table[bi] = fresh;
      }
      if (rope.scaling_type == "longrope" && !rope.long_for(r.length - 1) &&
          rope.long_for(r.length)) {
        // Crossing into the long factors: every position again, into private blocks.
        for (int32_t& blk : r.table) {
          if (pool.refcount(blk) == 1) continue;
          const int32_t fresh = pool.allocate();
          pool.release(blk);
          blk = fresh;
        }
        const std::vector<int32_t>& prompt = prompts[r.index];
        const std::vector<int32_t>& made = res.tokens[r.index];
        for (int64_t j = 0; j <= r.length; ++j) {
          const size_t pl = prompt.size();
          ids.push_back(static_cast<size_t>(j) < pl ? prompt[j] : made[j - pl]);
          positions.push_back(j);
        }
        entries.push_back({&r.table, 0, r.length + 1});
        continue;
      }
      ids.push_back(r.next);
      positions.push_back(r.length);
      entries.push_back({&r.table, r.length, 1});
    }
    if (entries.empty()) {
      for (Running& r : started) running.push_back(std::move(r));
      if (running.empty() && next_group == groups.size()) break;
      if (running.empty() && started.empty() && admitted.empty())
        LT_THROW(ErrorKind::kInternal, "generate: no progress with ", groups.size() - next_group,
                 " prompt groups waiting");
      continue;
    }
    const Tensor logits = forward_step(model, pool, ids, positions, entries);
    const std::vector<float> lv = logits.to_f32();
    const int64_t vsz = logits.size(1);
    size_t e = 0;
    for (int64_t gi : prefill) {
      PromptGroup& g = groups[static_cast<size_t>(gi)];
      g.logits.assign(lv.begin() + static_cast<int64_t>(e) * vsz,
                      lv.begin() + static_cast<int64_t>(e + 1) * vsz);
      g.prefilled = true;
      ++e;
    }
    for (const auto& [gi, member] : after_prefill) start(gi, member);
    std::vector<Running> still;
    for (Running& r : running) {
      r.length += 1;
      if (take(r, lv.data() + static_cast<int64_t>(e) * vsz, vsz))
        still.push_back(std::move(r));
      else
        finish(r);
      ++e;
    }
    for (Running& r : started) still.push_back(std::move(r));
    running = std::move(still);
    if (running.empty() && next_group == groups.size()) break;
  }
  LT_CHECK(pool.free_blocks() == pool.num_blocks() && reserved == 0,
           "generate: ", pool.num_blocks() - pool.free_blocks(), " kv blocks and ", reserved,
           " reserved left at the end");
  return res;
}

}  // namespace leantune
