// DecoderModel: construction, random init, HF weight loading and saving, forward and the loss
// (see decoder.h).
#include "models/decoder.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <unordered_set>

#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "engine/offload.h"
#include "engine/ops.h"
#include "engine/rng.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/residual.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "models/checkpoint_checks.h"

namespace leantune {

namespace {
Tensor param(const Shape& shape, Device device, DType dtype, const std::string& name) {
  Tensor t = Tensor::empty(shape, dtype, device, MemTag::kParam);
  t.set_name(name);
  t.set_param(true);
  return t;
}

LinearModule make_linear(const std::string& name, int64_t in, int64_t out, bool bias, Device device,
                         DType dtype, bool allocate_weight = true) {
  LinearModule m;
  m.name = name;
  m.in_features = in;
  m.out_features = out;
  if (allocate_weight) m.weight = param({out, in}, device, dtype, name + ".weight");
  if (bias) m.bias = param({out}, device, dtype, name + ".bias");
  return m;
}

// The row statistics of full logits [T, V] over the rows whose target is not ignored.
kernels::LinearCrossEntropyStats full_logits_stats(const Tensor& logits, const Tensor& targets) {
  NoGradGuard ng;
  const Tensor z = logits.detach();
  const int64_t t = z.size(0);
  const DType sd = z.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor rows = Tensor::empty({t}, sd, z.device(), MemTag::kWorkspace);
  Tensor lse = Tensor::empty({t}, sd, z.device(), MemTag::kWorkspace);
  Tensor ent = Tensor::empty({t}, sd, z.device(), MemTag::kWorkspace);
  Tensor top = Tensor::empty({t}, sd, z.device(), MemTag::kWorkspace);
  kernels::cross_entropy_fwd(z, targets, rows, lse);
  kernels::cross_entropy_row_stats(z, targets, lse, ent, top);
  const std::vector<int64_t> y = targets.to_i64();
  const std::vector<double> e = ent.to_f64(), hit = top.to_f64();
  kernels::LinearCrossEntropyStats s;
  for (int64_t i = 0; i < t; ++i) {
    if (y[i] == kernels::kIgnoreIndex) continue;
    s.entropy_sum += e[i];
    s.top1 += hit[i] > 0.5 ? 1 : 0;
  }
  return s;
}
}  // namespace

DecoderModel::DecoderModel(ModelConfig cfg, Device device, DType dtype,
                           bool allocate_linear_weights)
    : cfg_(std::move(cfg)), device_(device), dtype_(dtype) {
  const bool w = allocate_linear_weights;
  LT_CHECK_INPUT(
      dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF64,
      "unsupported compute dtype ", dtype_name(dtype));
  const int64_t h = cfg_.hidden_size, inter = cfg_.intermediate_size, d = cfg_.head_dim;
  const int64_t nq = cfg_.num_attention_heads * d, nkv = cfg_.num_key_value_heads * d;
  embed_tokens_ = param({cfg_.vocab_size, h}, device, dtype, "model.embed_tokens.weight");
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DecoderLayer layer;
    auto norm = [&](const char* name, int64_t n) {
      return param({n}, device, dtype, p + name + ".weight");
    };
    layer.input_layernorm = norm("input_layernorm", h);
    layer.post_attention_layernorm = norm("post_attention_layernorm", h);
    if (cfg_.sandwich_norms) {
      layer.pre_feedforward_layernorm = norm("pre_feedforward_layernorm", h);
      layer.post_feedforward_layernorm = norm("post_feedforward_layernorm", h);
    }
    if (cfg_.qk_norm) {
      layer.q_norm = norm("self_attn.q_norm", d);
      layer.k_norm = norm("self_attn.k_norm", d);
    }
    const bool ab = cfg_.attention_bias, mb = cfg_.mlp_bias;
    if (cfg_.fused_qkv) {
      layer.qkv_proj = make_linear(p + "self_attn.qkv_proj", h, nq + 2 * nkv, ab, device, dtype, w);
    } else {
      layer.q_proj = make_linear(p + "self_attn.q_proj", h, nq, ab, device, dtype, w);
      layer.k_proj = make_linear(p + "self_attn.k_proj", h, nkv, ab, device, dtype, w);
      layer.v_proj = make_linear(p + "self_attn.v_proj", h, nkv, ab, device, dtype, w);
    }
    layer.o_proj = make_linear(p + "self_attn.o_proj", nq, h, cfg_.o_proj_bias, device, dtype, w);
    if (cfg_.fused_gate_up) {
      layer.gate_up_proj = make_linear(p + "mlp.gate_up_proj", h, 2 * inter, mb, device, dtype, w);
    } else {
      layer.gate_proj = make_linear(p + "mlp.gate_proj", h, inter, mb, device, dtype, w);
      layer.up_proj = make_linear(p + "mlp.up_proj", h, inter, mb, device, dtype, w);
    }
    layer.down_proj = make_linear(p + "mlp.down_proj", inter, h, mb, device, dtype, w);
    layers_.push_back(std::move(layer));
  }
  norm_ = param({h}, device, dtype, "model.norm.weight");
  if (cfg_.sequence_classification) {
    LT_CHECK_INPUT(cfg_.num_labels >= 1, "num_labels must be >= 1, got ", cfg_.num_labels);
    score_ = param({cfg_.num_labels, h}, device, dtype, "score.weight");
  } else if (!cfg_.tie_word_embeddings) {
    lm_head_ = make_linear("lm_head", h, cfg_.vocab_size, false, device, dtype);
  }
}

std::vector<std::pair<std::string, Tensor>> DecoderModel::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", embed_tokens_);
  auto add_linear = [&](const LinearModule& m) {
    if (m.weight.defined()) out.emplace_back(m.name + ".weight", m.weight);
    if (m.bias.defined()) out.emplace_back(m.name + ".bias", m.bias);
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayer& L = layers_[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // Norms and projections interleaved as before the families were added (the names are what
    // matter; the order keeps optimizer-state files of Llama/Qwen2 runs unchanged).
    const std::vector<std::pair<const char*, Tensor>> norms = L.norms();
    const std::vector<const LinearModule*> linears = L.linears();
    out.emplace_back(p + norms[0].first + ".weight", norms[0].second);  // input_layernorm
    size_t li = 0;
    for (; li < linears.size() && linears[li]->name.find(".self_attn.") != std::string::npos; ++li)
      add_linear(*linears[li]);
    for (size_t n = 1; n < norms.size(); ++n)
      out.emplace_back(p + norms[n].first + ".weight", norms[n].second);
    for (; li < linears.size(); ++li) add_linear(*linears[li]);
  }
  out.emplace_back("model.norm.weight", norm_);
  if (score_.defined())
    out.emplace_back("score.weight", score_);
  else if (!tied())
    out.emplace_back("lm_head.weight", lm_head_.weight);
  return out;
}

std::vector<LinearModule*> DecoderLayer::linears() {
  std::vector<LinearModule*> out;
  for (LinearModule* m : {&q_proj, &k_proj, &v_proj, &qkv_proj, &o_proj, &gate_proj, &up_proj,
                          &gate_up_proj, &down_proj})
    if (!m->name.empty()) out.push_back(m);
  return out;
}

std::vector<const LinearModule*> DecoderLayer::linears() const {
  std::vector<const LinearModule*> out;
  for (LinearModule* m : const_cast<DecoderLayer*>(this)->linears()) out.push_back(m);
  return out;
}

std::vector<std::pair<const char*, Tensor>> DecoderLayer::norms() const {
  std::vector<std::pair<const char*, Tensor>> out = {{"input_layernorm", input_layernorm}};
  if (q_norm.defined()) {
    out.emplace_back("self_attn.q_norm", q_norm);
    out.emplace_back("self_attn.k_norm", k_norm);
  }
  out.emplace_back("post_attention_layernorm", post_attention_layernorm);
  if (pre_feedforward_layernorm.defined()) {
    out.emplace_back("pre_feedforward_layernorm", pre_feedforward_layernorm);
    out.emplace_back("post_feedforward_layernorm", post_feedforward_layernorm);
  }
  return out;
}

std::vector<LinearModule*> DecoderModel::linear_modules() {
  std::vector<LinearModule*> out;
  for (DecoderLayer& L : layers_)
    for (LinearModule* m : L.linears()) out.push_back(m);
  if (!tied() && !score_.defined()) out.push_back(&lm_head_);
  return out;
}

void DecoderModel::set_requires_grad(bool on) {
  for (auto& [name, t] : named_parameters()) t.set_requires_grad(on);
}

int64_t DecoderModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  for (const LinearModule* m : const_cast<DecoderModel*>(this)->linear_modules())
    if (!m->weight.defined()) n += m->in_features * m->out_features;
  return n;
}

void DecoderModel::init_random(uint64_t seed) {
  Generator gen(seed, RngPurpose::kInit);
  NoGradGuard ng;
  for (auto& [name, t] : named_parameters()) {
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_norm)
      t.fill_(cfg_.norm_unit_offset ? 0.0 : 1.0);  // (1 + w) norms start at w = 0
    else if (is_bias)
      t.fill_(0.0);
    else
      normal_(t, gen, 0.0, cfg_.initializer_range);
  }
}

std::vector<std::string> DecoderModel::load_weights(
    const TensorStore& store, const std::unordered_set<std::string>& optional) {
  NoGradGuard ng;
  std::vector<std::string> missing, skipped;
  auto params = named_parameters();
  for (auto& [name, t] : params) {
    if (!store.contains(name)) {
      (optional.count(name) ? skipped : missing).push_back(name);
      continue;
    }
    Tensor src = store.get(name);
    check_checkpoint_tensor(name, src, t.shape());
    t.copy_(src);
    // Streaming: the file's pages of this tensor go as soon as it is on the device.
    src = Tensor();
    store.release(name);
  }
  check_no_missing_tensors(missing, "checkpoint");
  std::unordered_set<std::string> used;
  for (auto& [name, t] : params) used.insert(name);
  unused_ = check_unexpected_tensors(store, used, cfg_);
  return skipped;
}

std::vector<std::string> check_unexpected_tensors(const TensorStore& store,
                                                  const std::unordered_set<std::string>& used,
                                                  const ModelConfig& cfg) {
  std::vector<std::string> known, unexpected;
  int64_t extra_layer = -1;
  for (const std::string& n : store.names()) {
    if (used.count(n)) continue;
    // A tied checkpoint may still store lm_head.weight (the embedding is what counts), and older
    // Llama exports store the rotary inv_freq buffer, which is recomputed from the config.
    // A sequence classifier loaded from a causal-LM folder leaves its LM head (transformers
    // ignores it the same way when TRL loads one for reward modelling).
    const bool is_known =
        ((cfg.tie_word_embeddings || cfg.sequence_classification) && n == "lm_head.weight") ||
        n.find("rotary_emb.inv_freq") != std::string::npos;
    (is_known ? known : unexpected).push_back(n);
    int64_t layer = -1;
    if (std::sscanf(n.c_str(), "model.layers.%lld.", reinterpret_cast<long long*>(&layer)) == 1)
      extra_layer = std::max(extra_layer, layer);
  }
  if (!unexpected.empty()) {
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 3; ++i)
      list += (i ? ", " : "") + printable(unexpected[i]);
    if (unexpected.size() > 3) list += ", ...";
    const std::string why = extra_layer >= cfg.num_hidden_layers
                                ? "config.json has num_hidden_layers " +
                                      std::to_string(cfg.num_hidden_layers) +
                                      " but the weights have layer " + std::to_string(extra_layer)
                                : "not part of a " + cfg.architecture + " with this config.json";
    LT_THROW(ErrorKind::kInput, store.path(), ": ", unexpected.size(),
             " tensor(s) the model does not use (", why, "): ", list,
             "; refusing to drop weights silently");
  }
  return known;
}

void check_causal_lm(const ModelConfig& cfg, const std::string& dir) {
  LT_CHECK_INPUT(!cfg.sequence_classification, dir, ": ", cfg.architecture,
                 " is a sequence classifier (a reward model) without an LM head; this needs a "
                 "causal LM (score it with trainer_bin score)");
}

std::unique_ptr<DecoderModel> DecoderModel::load(const std::string& dir, Device device,
                                                 DType dtype) {
  ModelConfig cfg = ModelConfig::load(dir);
  check_causal_lm(cfg, dir);
  auto model = std::make_unique<DecoderModel>(cfg, device, dtype);
  model->load_weights(TensorStore::open(dir));
  return model;
}

int64_t ParamResidency::unit_of(const std::string& name) {
  const std::string p = "model.layers.";
  if (name.rfind(p, 0) != 0) return kOuterUnit;
  return std::stoll(name.substr(p.size()));
}

std::vector<std::pair<std::string, Tensor>> DecoderModel::host_tensors(DType disk_dtype,
                                                                       bool keep) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<std::pair<std::string, std::function<Tensor()>>> sources;
  for (const auto& [name, t] : named_parameters()) sources.emplace_back(name, [t] { return t; });
  // Quantized weights are written dequantized: the folder is a plain HF model.
  for (LinearModule* m : const_cast<DecoderModel*>(this)->linear_modules())
    if (!m->weight.defined() && m->base)
      sources.emplace_back(m->name + ".weight",
                           [m, disk_dtype] { return m->dense_weight(disk_dtype); });
  // One acquisition per run of tensors of one unit (the outer unit twice: embedding, then norm
  // and head). Without a residency a host tensor in disk_dtype is written as it is.
  std::optional<ParamUse> use;
  int64_t unit = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const int64_t u = ParamResidency::unit_of(sources[i].first);
    if (residency_ && (!use || u != unit)) {
      use.reset();
      use.emplace(residency_, u);
      unit = u;
    }
    if (!keep) continue;
    const Tensor t = sources[i].second().detach();
    Tensor h = t.to(Device::cpu(), disk_dtype, MemTag::kOther);
    // A unit's memory is released after its use: the host copy must own its bytes.
    if (residency_ && h.storage() == t.storage()) h = h.clone();
    tensors.emplace_back(sources[i].first, h);
  }
  return tensors;
}

void DecoderModel::save(const std::string& dir, DType disk_dtype, uint64_t max_shard_bytes) const {
  std::filesystem::create_directories(dir);
  if (residency_) {
    // ZeRO-3: the ranks' gathers go unit by unit, in the order every rank runs them.
    save_model_tensors(dir, host_tensors(disk_dtype, true), max_shard_bytes);
  } else {
    // Streaming: each tensor is converted and copied to the host when the writer reaches it.
    std::vector<TensorSource> sources;
    for (const auto& [name, t] : named_parameters())
      sources.push_back({name, disk_dtype, t.shape(), [t, disk_dtype] {
                           return t.detach().to(Device::cpu(), disk_dtype, MemTag::kOther);
                         }});
    for (LinearModule* m : const_cast<DecoderModel*>(this)->linear_modules())
      if (!m->weight.defined() && m->base)
        sources.push_back(
            {m->name + ".weight", disk_dtype, {m->out_features, m->in_features}, [m, disk_dtype] {
               return m->dense_weight(disk_dtype).detach();
             }});
    save_model_sources(dir, sources, max_shard_bytes);
  }
  ModelConfig cfg = cfg_;
  cfg.torch_dtype = disk_dtype;
  cfg.save(dir);
}

SeqHints seq_hints(const Batch& b) {
  SeqHints h(b.max_seqlen);
  const bool host = b.cu_seqlens.device().is_cpu();
  if (!host && h.longest > 0) return h;
  const std::vector<int64_t> c = b.cu_seqlens.to_i64();
  if (h.longest <= 0)
    for (size_t i = 1; i < c.size(); ++i) h.longest = std::max(h.longest, c[i] - c[i - 1]);
  if (host && !c.empty()) h.total = c.back();
  return h;
}

ForwardResult DecoderModel::forward(const Batch& batch, const ForwardOptions& opt) {
  LT_CHECK(batch.input_ids.defined() && batch.cu_seqlens.defined(), "forward on an empty batch");
  const MemPhase outer = current_mem_phase();
  MemPhaseGuard phase(outer.kind == MemPhaseKind::kNone ? MemPhase{MemPhaseKind::kForward} : outer);
  Tensor ids = batch.input_ids.to(device_);
  Tensor pos = batch.position_ids.to(device_);
  Tensor cu = batch.cu_seqlens.to(device_);
  Tensor hidden = hidden_states(ids, pos, cu, seq_hints(batch), opt.gradient_checkpointing,
                                opt.row_grad_sink, opt.context_parallel);
  const double cap = logit_softcap();
  // LM head and loss: much memory traffic for little compute if offloaded (as TRL decides).
  NoOffloadScope head;
  ForwardResult r;
  Tensor targets_host;
  if (opt.need_loss) {
    LT_CHECK(batch.labels.defined(), "forward: loss asked for a batch without labels");
    targets_host =
        opt.labels_shifted ? batch.labels : kernels::shift_labels(batch.labels, batch.cu_seqlens);
    int64_t n = 0;
    for (int64_t v : targets_host.to_i64()) n += v != kernels::kIgnoreIndex;
    r.label_tokens = n;
  }
  ParamUse use(residency_, ParamResidency::kOuterUnit);
  const bool need_full_logits = opt.need_logits || (opt.need_loss && !opt.fused_loss);
  if (need_full_logits) r.logits = logits(hidden);
  if (opt.need_loss) {
    // The fused loss computes its gradients here, in forward: its own phase in the memory report.
    StepPhaseGuard phase(grad_mode_enabled() ? "loss" : step_phase());
    MemSiteGuard site(opt.fused_loss ? "lm_head + loss (fused)" : "loss");
    const double normalizer = opt.normalizer > 0
                                  ? opt.normalizer
                                  : static_cast<double>(std::max<int64_t>(r.label_tokens, 1));
    Tensor targets = targets_host.to(device_);
    if (opt.fused_loss) {
      kernels::LinearCrossEntropyOptions lo;
      lo.chunk_tokens = opt.loss_chunk_tokens;
      lo.softcap = cap;
      const Tensor w = lm_head_weight();
      if (opt.row_grad_sink && !cfg_.tie_word_embeddings && w.requires_grad() &&
          grad_mode_enabled()) {
        const RowGradSink& sink = opt.row_grad_sink;
        r.loss = kernels::linear_cross_entropy_weight_blocks(
            hidden, w, targets, normalizer,
            [&sink, &w](int64_t row0, const Tensor& g) { sink(w, row0, g); }, lo);
      } else {
        kernels::LinearCrossEntropyStats stats;
        const bool with_stats = opt.row_stats && (cap == 0 || device_.is_cpu());
        if (with_stats) lo.stats = &stats;
        r.loss = kernels::linear_cross_entropy(hidden, w, targets, normalizer, lo);
        if (with_stats) r.row_stats = stats;
      }
    } else {
      r.loss = kernels::cross_entropy(r.logits, targets, normalizer);
      if (opt.row_stats) r.row_stats = full_logits_stats(r.logits, targets);
    }
  }
  return r;
}

}  // namespace leantune
