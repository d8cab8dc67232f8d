// The decoder's computation (models/decoder.h): the embedding, one layer with the family's
// options, the layer stack with checkpointing and offloading, the final norm and the LM head.
// Generation (models/generate.cpp) runs the same layer through layer_forward_with with its own
// attention step over the KV cache, so the two paths cannot drift apart.
#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "engine/offload.h"
#include "engine/ops.h"
#include "engine/tiled.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/residual.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/scale.h"
#include "kernels/softcap.h"
#include "kernels/split.h"
#include "kernels/swiglu.h"
#include "models/decoder.h"

namespace leantune {

Tensor DecoderModel::embed(const Tensor& ids, const RowGradSink& sink) const {
  ParamUse use(residency_, ParamResidency::kOuterUnit);
  MemSiteGuard site("embed_tokens");
  Tensor e;
  if (embedding_override.embed) {
    e = embedding_override.embed(embed_tokens_, ids);
  } else if (sink && !cfg_.tie_word_embeddings && embed_tokens_.requires_grad() &&
             grad_mode_enabled()) {
    const Tensor w = embed_tokens_;
    e = kernels::embedding_weight_blocks(
        w, ids, [sink, w](int64_t row0, const Tensor& g) { sink(w, row0, g); });
  } else {
    e = kernels::embedding(embed_tokens_, ids);
  }
  if (!cfg_.scale_embeddings) return e;
  // Gemma: embedding * sqrt(hidden), the factor a float32 tensor cast to the weight's dtype.
  const float root = static_cast<float>(std::sqrt(static_cast<double>(cfg_.hidden_size)));
  return kernels::scale(e, kernels::round_to_dtype(static_cast<double>(root), e.dtype()));
}

Tensor DecoderModel::norm(const Tensor& x, const Tensor& w) const {
  return kernels::rms_norm(x, w, cfg_.rms_norm_eps, cfg_.norm_unit_offset);
}

Tensor DecoderModel::final_norm_forward(const Tensor& h) const {
  MemSiteGuard site("norm");
  return norm(h, norm_);
}

Tensor DecoderModel::apply_rope(int64_t layer, const Tensor& x, const Tensor& positions,
                                int64_t max_position) const {
  const kernels::RopeConfig& rc = cfg_.rope_of(layer);
  if (rc.scaling_type != "longrope") return kernels::rope(x, positions, rc);
  if (max_position < 0) {
    for (int64_t p : positions.to_i64()) max_position = std::max(max_position, p);
  }
  kernels::RopeConfig chosen = rc;
  chosen.use_long = rc.long_for(max_position);
  return kernels::rope(x, positions, chosen);
}

kernels::AttentionOptions DecoderModel::attention_options(int64_t layer) const {
  kernels::AttentionOptions ao;
  ao.scale = cfg_.attention_scale;
  ao.window = cfg_.window_of(layer);
  ao.softcap = cfg_.attn_logit_softcapping;
  return ao;
}

std::vector<Tensor> DecoderModel::attention_inputs(int64_t i, const Tensor& h) const {
  const DecoderLayer& L = layers_[i];
  const int64_t t = h.size(0), d = cfg_.head_dim;
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  Tensor x = norm(h, L.input_layernorm);
  Tensor q, k, v;
  if (cfg_.fused_qkv) {
    const std::vector<Tensor> qkv =
        kernels::split_columns(L.qkv_proj.forward(x), {{nh, d}, {nkv, d}, {nkv, d}});
    q = qkv[0];
    k = qkv[1];
    v = qkv[2];
  } else {
    q = L.q_proj.forward(x).view({t, nh, d});
    k = L.k_proj.forward(x).view({t, nkv, d});
    v = L.v_proj.forward(x).view({t, nkv, d});
  }
  if (cfg_.qk_norm) {
    q = norm(q, L.q_norm);
    k = norm(k, L.k_norm);
  }
  return {q, k, v};
}

kernels::AddRmsNormOutput DecoderModel::attention_residual(int64_t i, const Tensor& h,
                                                           const Tensor& attn) const {
  const DecoderLayer& L = layers_[i];
  Tensor a;
  {
    MemSiteGuard site("self_attn.o_proj");
    a = L.o_proj.forward(attn);
    if (cfg_.sandwich_norms) a = norm(a, L.post_attention_layernorm);
  }
  // The MLP's input norm: pre_feedforward_layernorm with sandwich norms, else
  // post_attention_layernorm.
  const bool sandwich = cfg_.sandwich_norms;
  MemSiteGuard site(sandwich ? "pre_feedforward_layernorm" : "post_attention_layernorm");
  return kernels::add_rms_norm(h, std::move(a),
                               sandwich ? L.pre_feedforward_layernorm : L.post_attention_layernorm,
                               cfg_.rms_norm_eps, cfg_.norm_unit_offset);
}

Tensor DecoderModel::mlp_residual(int64_t i, const kernels::AddRmsNormOutput& h1) const {
  MemSiteGuard site("mlp");
  const DecoderLayer& L = layers_[i];
  const Tensor& x2 = h1.y;
  Tensor gate, up;
  if (cfg_.fused_gate_up) {
    const int64_t inter = cfg_.intermediate_size;
    const std::vector<Tensor> gu =
        kernels::split_columns(L.gate_up_proj.forward(x2), {{inter}, {inter}});
    gate = gu[0];
    up = gu[1];
  } else {
    gate = L.gate_proj.forward(x2);
    up = L.up_proj.forward(x2);
  }
  Tensor m = L.down_proj.forward(cfg_.mlp_activation == MlpActivation::kGeluTanh
                                     ? kernels::geglu(gate, up)
                                     : kernels::swiglu(gate, up));
  if (cfg_.sandwich_norms) m = norm(m, L.post_feedforward_layernorm);
  return kernels::residual_add(h1.sum, m);
}

Tensor DecoderModel::layer_forward_with(int64_t i, const Tensor& h,
                                        const LayerAttention& attend) const {
  ParamUse use(residency_, i);
  const int64_t t = h.size(0), nq = cfg_.num_attention_heads * cfg_.head_dim;
  std::vector<Tensor> qkv;
  Tensor a;
  {
    MemSiteGuard site("self_attn.qkv");
    qkv = attention_inputs(i, h);
  }
  {
    MemSiteGuard site("self_attn");
    a = attend(i, qkv[0], qkv[1], qkv[2]).view({t, nq});
  }
  return mlp_residual(i, attention_residual(i, h, a));
}

Tensor DecoderModel::layer_forward(int64_t i, const Tensor& h, const Tensor& positions,
                                   const Tensor& cu_seqlens, SeqHints seqs,
                                   const ContextParallel* cp) const {
  // Longrope picks its factors by the batch's largest position (as transformers does for a
  // padded batch), never a block's: read once per layer, and only by longrope.
  int64_t max_position = -1;
  if (cfg_.rope_of(i).scaling_type == "longrope")
    for (int64_t p : positions.to_i64()) max_position = std::max(max_position, p);
  auto attend_roped = [&](const Tensor& qr, const Tensor& kr, const Tensor& v) {
    kernels::AttentionOptions ao = attention_options(i);
    ao.max_seqlen_q = ao.max_seqlen_k = seqs.longest;
    ao.total_seqlen = seqs.total;
    if (cp) {
      LT_CHECK_INPUT(ao.window == 0 && ao.softcap == 0 && ao.scale == 0, cfg_.architecture,
                     ": context parallelism (cp_size > 1) does not support sliding-window, "
                     "soft-capped or rescaled attention");
      return kernels::zigzag_ring_attention(*cp->comm, qr, kr, v, cp->layout).out;
    }
    return kernels::attention(qr, kr, v, cu_seqlens, cu_seqlens, ao).out;
  };
  const int64_t t = h.size(0);
  const int64_t chunk = tiling_chunk_tokens(tiling_, cfg_, t);
  if (chunk == 0) {
    return layer_forward_with(i, h,
                              [&](int64_t l, const Tensor& q, const Tensor& k, const Tensor& v) {
                                return attend_roped(apply_rope(l, q, positions, max_position),
                                                    apply_rope(l, k, positions, max_position), v);
                              });
  }
  // Sequence tiling (models/sequence_tiling.h): what comes before attention and what follows it
  // run in blocks of rows; each region keeps only its inputs for backward.
  if (t > largest_tiled_rows_) {
    largest_tiled_rows_ = t;
    largest_tiled_chunk_ = chunk;
  }
  ParamUse use(residency_, i);
  const std::vector<Tensor> qkv = tiled_rows(
      [this, i, max_position](const std::vector<Tensor>& in) {
        ParamUse block(residency_, i);
        std::vector<Tensor> r = attention_inputs(i, in[0]);
        r[0] = apply_rope(i, r[0], in[1], max_position);
        r[1] = apply_rope(i, r[1], in[1], max_position);
        return r;
      },
      {h, positions}, chunk);
  const Tensor a =
      attend_roped(qkv[0], qkv[1], qkv[2]).view({t, cfg_.num_attention_heads * cfg_.head_dim});
  return tiled_rows(
      [this, i](const std::vector<Tensor>& in) {
        ParamUse block(residency_, i);
        return std::vector<Tensor>{mlp_residual(i, attention_residual(i, in[1], in[0]))};
      },
      {a, h}, chunk)[0];
}

Tensor DecoderModel::hidden_states(const Tensor& ids, const Tensor& positions,
                                   const Tensor& cu_seqlens, SeqHints seqs,
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
      auto fn = [this, l, positions, cu_seqlens, seqs, cp](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{layer_forward(l, in[0], positions, cu_seqlens, seqs, cp.get())};
      };
      h = checkpoint(fn, {h})[0];
    } else {
      h = layer_forward(l, h, positions, cu_seqlens, seqs, cp.get());
    }
  }
  // The final norm stays on the device under offloading, like the LM head and the loss.
  NoOffloadScope head;
  ParamUse use(residency_, ParamResidency::kOuterUnit);
  return final_norm_forward(h);
}

Tensor DecoderModel::logits(const Tensor& hidden) const {
  ParamUse use(residency_, ParamResidency::kOuterUnit);
  MemSiteGuard site("lm_head");
  const Tensor z = kernels::linear(hidden, lm_head_weight());
  return logit_softcap() > 0 ? kernels::softcap(z, logit_softcap()) : z;
}

}  // namespace leantune
