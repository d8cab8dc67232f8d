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
    layer.input_layernorm = param({h}, device, dtype, p + "input_layernorm.weight");
    layer.post_attention_layernorm =
        param({h}, device, dtype, p + "post_attention_layernorm.weight");
    layer.q_proj =
        make_linear(p + "self_attn.q_proj", h, nq, cfg_.attention_bias, device, dtype, w);
    layer.k_proj =
        make_linear(p + "self_attn.k_proj", h, nkv, cfg_.attention_bias, device, dtype, w);
    layer.v_proj =
        make_linear(p + "self_attn.v_proj", h, nkv, cfg_.attention_bias, device, dtype, w);
    layer.o_proj = make_linear(p + "self_attn.o_proj", nq, h, cfg_.o_proj_bias, device, dtype, w);
    layer.gate_proj = make_linear(p + "mlp.gate_proj", h, inter, cfg_.mlp_bias, device, dtype, w);
    layer.up_proj = make_linear(p + "mlp.up_proj", h, inter, cfg_.mlp_bias, device, dtype, w);
    layer.down_proj = make_linear(p + "mlp.down_proj", inter, h, cfg_.mlp_bias, device, dtype, w);
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
    out.emplace_back(p + "input_layernorm.weight", L.input_layernorm);
    for (const LinearModule* m : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj}) add_linear(*m);
    out.emplace_back(p + "post_attention_layernorm.weight", L.post_attention_layernorm);
    for (const LinearModule* m : {&L.gate_proj, &L.up_proj, &L.down_proj}) add_linear(*m);
  }
  out.emplace_back("model.norm.weight", norm_);
  if (score_.defined())
    out.emplace_back("score.weight", score_);
  else if (!tied())
    out.emplace_back("lm_head.weight", lm_head_.weight);
  return out;
}

std::vector<LinearModule*> DecoderModel::linear_modules() {
  std::vector<LinearModule*> out;
  for (DecoderLayer& L : layers_)
    for (LinearModule* m :
         {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj})
      out.push_back(m);
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
      t.fill_(1.0);
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
    LT_CHECK_INPUT(src.shape() == t.shape(), "tensor '", name, "' has shape ",
                   shape_str(src.shape()), " in the checkpoint, the config needs ",
                   shape_str(t.shape()));
    LT_CHECK_INPUT(dtype_is_floating(src.dtype()), "tensor '", name, "' has dtype ",
                   dtype_name(src.dtype()), "; expected a float type");
    t.copy_(src);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += ", ...";
    LT_THROW(ErrorKind::kInput, "checkpoint lacks ", missing.size(),
             " tensor(s) the model needs: ", list);
  }
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
  save_model_tensors(dir, host_tensors(disk_dtype, true), max_shard_bytes);
  ModelConfig cfg = cfg_;
  cfg.torch_dtype = disk_dtype;
  cfg.save(dir);
}

Tensor DecoderModel::embed(const Tensor& ids, const RowGradSink& sink) const {
  ParamUse use(residency_, ParamResidency::kOuterUnit);
  if (embedding_override.embed) return embedding_override.embed(embed_tokens_, ids);
  if (sink && !cfg_.tie_word_embeddings && embed_tokens_.requires_grad() && grad_mode_enabled()) {
    const Tensor w = embed_tokens_;
    return kernels::embedding_weight_blocks(
        w, ids, [sink, w](int64_t row0, const Tensor& g) { sink(w, row0, g); });
  }
  return kernels::embedding(embed_tokens_, ids);
}

Tensor DecoderModel::layer_forward(int64_t i, const Tensor& h, const Tensor& positions,
                                   const Tensor& cu_seqlens, int64_t max_seqlen,
                                   const ContextParallel* cp) const {
  ParamUse use(residency_, i);
  const DecoderLayer& L = layers_[i];
  const int64_t t = h.size(0), d = cfg_.head_dim;
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  Tensor x = kernels::rms_norm(h, L.input_layernorm, cfg_.rms_norm_eps);
  Tensor q = L.q_proj.forward(x).view({t, nh, d});
  Tensor k = L.k_proj.forward(x).view({t, nkv, d});
  Tensor v = L.v_proj.forward(x).view({t, nkv, d});
  q = kernels::rope(q, positions, cfg_.rope);
  k = kernels::rope(k, positions, cfg_.rope);
  kernels::AttentionOptions ao;
  ao.max_seqlen_q = ao.max_seqlen_k = max_seqlen;
  Tensor a = (cp ? kernels::zigzag_ring_attention(*cp->comm, q, k, v, cp->layout)
                 : kernels::attention(q, k, v, cu_seqlens, cu_seqlens, ao))
                 .out.view({t, nh * d});
  Tensor h1 = kernels::residual_add(h, L.o_proj.forward(a));
  Tensor x2 = kernels::rms_norm(h1, L.post_attention_layernorm, cfg_.rms_norm_eps);
  Tensor m = kernels::swiglu(L.gate_proj.forward(x2), L.up_proj.forward(x2));
  return kernels::residual_add(h1, L.down_proj.forward(m));
}

Tensor DecoderModel::hidden_states(const Tensor& ids, const Tensor& positions,
                                   const Tensor& cu_seqlens, int64_t max_seqlen,
                                   bool gradient_checkpointing, const RowGradSink& sink,
                                   std::shared_ptr<const ContextParallel> cp) const {
  Tensor h = embed(ids, sink);
  for (int64_t l = 0; l < num_layers(); ++l) {
    // What layer l saves is reloaded when backward nears it (activation offloading).
    OffloadLayerScope offload_layer(l);
    // Training forward (a forward phase, or any forward under grad mode outside a phase) is
    // attributed per layer: its backward inherits it, and ZeRO-3 gathers a layer for its backward
    // nodes by it. Evaluation and generation keep their own label.
    const MemPhaseKind kind = current_mem_phase().kind;
    const bool training =
        kind == MemPhaseKind::kForward || (kind == MemPhaseKind::kNone && grad_mode_enabled());
    MemPhaseGuard phase(training ? MemPhase{MemPhaseKind::kForward, static_cast<int32_t>(l)}
                                 : current_mem_phase());
    if (gradient_checkpointing && grad_mode_enabled()) {
      // The recompute in backward runs the ring again: `cp` is kept alive by the closure.
      auto fn = [this, l, positions, cu_seqlens, max_seqlen, cp](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            layer_forward(l, in[0], positions, cu_seqlens, max_seqlen, cp.get())};
      };
      h = checkpoint(fn, {h})[0];
    } else {
      h = layer_forward(l, h, positions, cu_seqlens, max_seqlen, cp.get());
    }
  }
  // The final norm stays on the device under offloading, like the LM head and the loss.
  NoOffloadScope head;
  ParamUse use(residency_, ParamResidency::kOuterUnit);
  return kernels::rms_norm(h, norm_, cfg_.rms_norm_eps);
}

Tensor DecoderModel::logits(const Tensor& hidden) const {
  ParamUse use(residency_, ParamResidency::kOuterUnit);
  return kernels::linear(hidden, lm_head_weight());
}

ForwardResult DecoderModel::forward(const Batch& batch, const ForwardOptions& opt) {
  LT_CHECK(batch.input_ids.defined() && batch.cu_seqlens.defined(), "forward on an empty batch");
  const MemPhase outer = current_mem_phase();
  MemPhaseGuard phase(outer.kind == MemPhaseKind::kNone ? MemPhase{MemPhaseKind::kForward} : outer);
  Tensor ids = batch.input_ids.to(device_);
  Tensor pos = batch.position_ids.to(device_);
  Tensor cu = batch.cu_seqlens.to(device_);
  int64_t max_seqlen = batch.max_seqlen;
  if (max_seqlen <= 0) {
    std::vector<int64_t> c = batch.cu_seqlens.to_i64();
    for (size_t i = 1; i < c.size(); ++i) max_seqlen = std::max(max_seqlen, c[i] - c[i - 1]);
  }
  Tensor hidden = hidden_states(ids, pos, cu, max_seqlen, opt.gradient_checkpointing,
                                opt.row_grad_sink, opt.context_parallel);
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
    const double normalizer = opt.normalizer > 0
                                  ? opt.normalizer
                                  : static_cast<double>(std::max<int64_t>(r.label_tokens, 1));
    Tensor targets = targets_host.to(device_);
    if (opt.fused_loss) {
      kernels::LinearCrossEntropyOptions lo;
      lo.chunk_tokens = opt.loss_chunk_tokens;
      const Tensor w = lm_head_weight();
      if (opt.row_grad_sink && !cfg_.tie_word_embeddings && w.requires_grad() &&
          grad_mode_enabled()) {
        const RowGradSink& sink = opt.row_grad_sink;
        r.loss = kernels::linear_cross_entropy_weight_blocks(
            hidden, w, targets, normalizer,
            [&sink, &w](int64_t row0, const Tensor& g) { sink(w, row0, g); }, lo);
      } else {
        r.loss = kernels::linear_cross_entropy(hidden, w, targets, normalizer, lo);
      }
    } else {
      r.loss = kernels::cross_entropy(r.logits, targets, normalizer);
    }
  }
  return r;
}

}  // namespace leantune
