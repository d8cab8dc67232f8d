#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "engine/rng.h"
#include "kernels/attention.h"
#include "kernels/residual.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

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

struct KVCache {
  int64_t capacity = 0;          // rows per sequence
  std::vector<Tensor> k, v;      // per layer [B * capacity, Hkv, D]
  std::vector<int64_t> lengths;  // filled rows per sequence
};

// One layer over `rows` new tokens; rows[i] belongs to sequence seq[i] at position pos[i].
// Prefill (all tokens of every sequence at once) uses the flat varlen attention; decode uses
// each sequence's cache region.
Tensor layer_cached(const DecoderModel& m, int64_t l, const Tensor& h, const Tensor& positions,
                    const std::vector<int64_t>& seq, const std::vector<int64_t>& pos,
                    KVCache& cache, bool prefill, const Tensor& cu_prefill, int64_t max_len) {
  const ModelConfig& c = m.config();
  const DecoderLayer& L = m.layer(l);
  const int64_t t = h.size(0), d = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads;
  Tensor x = kernels::rms_norm(h, L.input_layernorm, c.rms_norm_eps);
  Tensor q = kernels::rope(L.q_proj.forward(x).view({t, nh, d}), positions, c.rope);
  Tensor k = kernels::rope(L.k_proj.forward(x).view({t, nkv, d}), positions, c.rope);
  Tensor v = L.v_proj.forward(x).view({t, nkv, d});
  for (int64_t i = 0; i < t; ++i) {
    const int64_t row = seq[i] * cache.capacity + pos[i];
    cache.k[l].narrow(0, row, 1).copy_(k.narrow(0, i, 1));
    cache.v[l].narrow(0, row, 1).copy_(v.narrow(0, i, 1));
  }
  Tensor a;
  kernels::AttentionOptions ao;
  if (prefill) {
    ao.max_seqlen_q = ao.max_seqlen_k = max_len;
    a = kernels::attention(q, k, v, cu_prefill, cu_prefill, ao).out;
  } else {
    a = Tensor::empty({t, nh, d}, q.dtype(), q.device());
    for (int64_t i = 0; i < t; ++i) {
      const int64_t len = pos[i] + 1;
      Tensor cq = Tensor::from_vector<int32_t>({0, 1}, {2}, q.device());
      Tensor ck = Tensor::from_vector<int32_t>({0, static_cast<int32_t>(len)}, {2}, q.device());
      Tensor kk = cache.k[l].narrow(0, seq[i] * cache.capacity, len);
      Tensor vv = cache.v[l].narrow(0, seq[i] * cache.capacity, len);
      a.narrow(0, i, 1).copy_(kernels::attention(q.narrow(0, i, 1), kk, vv, cq, ck, ao).out);
    }
  }
  Tensor h1 = kernels::residual_add(h, L.o_proj.forward(a.view({t, nh * d})));
  Tensor x2 = kernels::rms_norm(h1, L.post_attention_layernorm, c.rms_norm_eps);
  Tensor mlp = kernels::swiglu(L.gate_proj.forward(x2), L.up_proj.forward(x2));
  return kernels::residual_add(h1, L.down_proj.forward(mlp));
}

}  // namespace

GenerationResult generate(const DecoderModel& model,
                          const std::vector<std::vector<int32_t>>& prompts,
                          const GenerationConfig& cfg) {
  NoGradGuard ng;
  MemPhaseGuard phase(MemPhaseKind::kGeneration);
  MemTagGuard tag(MemTag::kKVCache);
  const ModelConfig& c = model.config();
  const Device dev = model.device();
  const int64_t b = static_cast<int64_t>(prompts.size());
  GenerationResult res;
  res.tokens.resize(b);
  res.finished_by_eos.assign(b, false);
  if (b == 0) return res;
  std::vector<int64_t> eos = cfg.eos_token_ids.empty() ? c.eos_token_ids : cfg.eos_token_ids;
  int64_t max_prompt = 0;
  for (const auto& p : prompts) {
    LT_CHECK_INPUT(!p.empty(), "generate: an empty prompt");
    for (int32_t id : p)
      LT_CHECK_INPUT(id >= 0 && id < c.vocab_size, "generate: token id ", id,
                     " outside the vocabulary (", c.vocab_size, ")");
    max_prompt = std::max<int64_t>(max_prompt, static_cast<int64_t>(p.size()));
  }
  KVCache cache;
  cache.capacity = max_prompt + std::max<int64_t>(cfg.max_new_tokens, 0);
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    cache.k.push_back(Tensor::empty({b * cache.capacity, c.num_key_value_heads, c.head_dim},
                                    model.dtype(), dev, MemTag::kKVCache));
    cache.v.push_back(Tensor::empty({b * cache.capacity, c.num_key_value_heads, c.head_dim},
                                    model.dtype(), dev, MemTag::kKVCache));
    res.kv_cache_bytes += 2 * static_cast<int64_t>(cache.k.back().nbytes());
  }
  cache.lengths.assign(b, 0);

  // One stream per sequence (the generator's rank field carries the sequence number): what a
  // sequence draws does not depend on the others in the batch.
  LT_CHECK_INPUT(cfg.first_sequence >= 0 && cfg.first_sequence + b <= int64_t{UINT32_MAX},
                 "generate: sequence numbers ", cfg.first_sequence, " .. ", cfg.first_sequence + b,
                 " outside the 32-bit stream range");
  std::vector<Generator> gens;
  for (int64_t s = 0; s < b; ++s)
    gens.emplace_back(cfg.seed, RngPurpose::kSampling,
                      static_cast<uint32_t>(cfg.first_sequence + s));
  std::vector<int64_t> active(b);
  std::iota(active.begin(), active.end(), 0);
  // Step 0 is the prefill of every prompt; later steps feed one new token per active sequence.
  std::vector<int64_t> ids, seq, pos, last_row;
  std::vector<int32_t> cu{0};
  int64_t max_len = 0;
  for (int64_t s = 0; s < b; ++s) {
    for (size_t j = 0; j < prompts[s].size(); ++j) {
      ids.push_back(prompts[s][j]);
      seq.push_back(s);
      pos.push_back(static_cast<int64_t>(j));
    }
    cu.push_back(static_cast<int32_t>(ids.size()));
    last_row.push_back(static_cast<int64_t>(ids.size()) - 1);
    max_len = std::max<int64_t>(max_len, static_cast<int64_t>(prompts[s].size()));
  }
  bool prefill = true;
  for (int64_t step = 0; step < cfg.max_new_tokens && !active.empty(); ++step) {
    const int64_t t = static_cast<int64_t>(ids.size());
    Tensor tid = Tensor::from_vector(ids, {t}, dev);
    Tensor tpos = Tensor::from_vector(pos, {t}, dev);
    Tensor tcu = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())}, dev);
    Tensor h = model.embed(tid);
    for (int64_t l = 0; l < model.num_layers(); ++l)
      h = layer_cached(model, l, h, tpos, seq, pos, cache, prefill, tcu, max_len);
    // Only the last row of each sequence needs logits.
    Tensor rows = Tensor::empty({static_cast<int64_t>(last_row.size()), h.size(1)}, h.dtype(), dev);
    for (size_t i = 0; i < last_row.size(); ++i)
      rows.narrow(0, i, 1).copy_(h.narrow(0, last_row[i], 1));
    Tensor logits = model.logits(kernels::rms_norm(rows, model.final_norm(), c.rms_norm_eps));
    std::vector<float> lv = logits.to_f32();
    const int64_t vsz = logits.size(1);
    for (size_t i = 0; i < active.size(); ++i)
      cache.lengths[active[i]] += prefill ? prompts[active[i]].size() : 1;
    std::vector<int64_t> next_active;
    ids.clear();
    seq.clear();
    pos.clear();
    last_row.clear();
    cu.assign(1, 0);
    for (size_t i = 0; i < active.size(); ++i) {
      const int64_t s = active[i];
      std::vector<float> row(lv.begin() + i * vsz, lv.begin() + (i + 1) * vsz);
      std::vector<int32_t> seen;
      if (cfg.repetition_penalty != 1.0) {
        seen = prompts[s];
        seen.insert(seen.end(), res.tokens[s].begin(), res.tokens[s].end());
      }
      const int32_t tok = sample_token(row, cfg, gens[static_cast<size_t>(s)], seen);
      res.tokens[s].push_back(tok);
      if (std::find(eos.begin(), eos.end(), tok) != eos.end()) {
        res.finished_by_eos[s] = true;
        continue;
      }
      next_active.push_back(s);
      ids.push_back(tok);
      seq.push_back(s);
      pos.push_back(cache.lengths[s]);
      last_row.push_back(static_cast<int64_t>(ids.size()) - 1);
      cu.push_back(static_cast<int32_t>(ids.size()));
    }
    active = std::move(next_active);
    prefill = false;
  }
  return res;
}

}  // namespace leantune
