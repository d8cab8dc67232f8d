// The memory estimate (see estimate.h). Every byte count is a CheckedInt: options whose sizes
// pass 2^63 bytes are an OverflowError, never a wrapped (negative) size.
#include "trainers/estimate/estimate.h"

#include <algorithm>
#include <cmath>

#include "engine/checked_int.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/optim_8bit.h"
#include "models/sequence_tiling.h"

namespace leantune {

namespace {

using I = CheckedInt;

struct ModuleShape {
  std::string kind;  // q_proj, ...
  I in, out;
  bool bias;
};

// One decoder layer's projections as the family has them (Phi-3: fused qkv_proj, gate_up_proj).
std::vector<ModuleShape> layer_modules(const ModelConfig& m) {
  const I h = m.hidden_size, i = m.intermediate_size, d = m.head_dim;
  const I nq = d * m.num_attention_heads, nkv = d * m.num_key_value_heads;
  std::vector<ModuleShape> out;
  if (m.fused_qkv) {
    out.push_back({"qkv_proj", h, nq + 2 * nkv, m.attention_bias});
  } else {
    out.push_back({"q_proj", h, nq, m.attention_bias});
    out.push_back({"k_proj", h, nkv, m.attention_bias});
    out.push_back({"v_proj", h, nkv, m.attention_bias});
  }
  out.push_back({"o_proj", nq, h, m.o_proj_bias});
  if (m.fused_gate_up) {
    out.push_back({"gate_up_proj", h, 2 * i, m.mlp_bias});
  } else {
    out.push_back({"gate_proj", h, i, m.mlp_bias});
    out.push_back({"up_proj", h, i, m.mlp_bias});
  }
  out.push_back({"down_proj", i, h, m.mlp_bias});
  return out;
}

// The element counts of one layer's normalisation weights (input/post-attention norms, the
// sandwich norms, the q/k norms over head_dim).
std::vector<int64_t> layer_norms(const ModelConfig& m) {
  std::vector<int64_t> out(m.sandwich_norms ? 4 : 2, m.hidden_size);
  if (m.qk_norm) out.insert(out.end(), 2, m.head_dim);
  return out;
}

// PEFT's matching, per module kind: an entry names the kind, or ends with "." + kind.
bool targeted(const std::vector<std::string>& targets, const std::string& kind) {
  if (targets.empty()) return kind == "q_proj" || kind == "v_proj";
  for (const std::string& t : targets) {
    if (t == "all-linear" || t == kind) return true;
    if (t.size() > kind.size() &&
        t.compare(t.size() - kind.size() - 1, kind.size() + 1, "." + kind) == 0)
      return true;
  }
  return false;
}

bool listed(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

I quantized_bytes(I n, I rows, const EstimateConfig& c, I dense) {
  if (c.load_in_4bit) {
    const I blocks = (n + 63) / 64;
    const I absmax = c.double_quant ? blocks + ((blocks + 255) / 256) * 4 + 4 : blocks * 4;
    return (n + 1) / 2 + absmax;
  }
  if (c.load_in_8bit) return n + rows * 4;
  return dense;
}

// Optimizer state of `trainable` parameters in dtype b (b == 4: no master needed).
I optimizer_state_bytes(const EstimateConfig& c, I trainable, I b, const ModelConfig& m) {
  const I master = b == 2 ? trainable * 4 : 0;
  if (c.optim == "adamw_8bit" || c.optim == "adamw_bnb_8bit" || c.optim == "paged_adamw_8bit")
    return trainable * 2 + trainable / 32;
  if (c.optim == "paged_adamw_32bit") return trainable * 8;
  if (c.optim == "sgd") return master;
  if (c.optim == "adafactor") {
    // Row and column f32 statistics of each trained matrix, the full second moment of vectors.
    I rc = 0;
    for (const ModuleShape& s : layer_modules(m)) {
      if (!c.use_peft)
        rc += s.in + s.out + (s.bias ? s.out : 0);
      else if (targeted(c.lora_target_modules, s.kind))
        rc += (s.in + c.lora_r) + (s.out + c.lora_r);
    }
    const I layers = m.num_hidden_layers, hidden = m.hidden_size, vocab = m.vocab_size;
    rc = rc * layers + (!c.use_peft ? layers * m.layer_norm_parameters() + hidden : I(0));
    if (!c.use_peft)
      rc += m.sequence_classification ? (vocab + hidden) + (hidden + m.num_labels)
                                      : (vocab + hidden) * (m.tie_word_embeddings ? 1 : 2);
    return rc * 4;
  }
  return trainable * 8 + master;  // adamw_torch
}

// Attention's workspace beside its inputs and outputs, in forward or backward: on the CPU each
// worker thread's slab of key/value rows and score blocks for the longest sequence
// (kernels/attention.cpp); on CUDA (kernels/attention.cu) the backward's tensor-core kernels
// (bf16/f16, head_dim 64 or 128, no soft-capping) hold an f32 dQ accumulator and two f32 row
// statistics, the simple kernel (f32, f64, other head dims, soft-capped scores) writes dQ in
// place and holds one row statistic (Dsum).
I attention_workspace(const EstimateConfig& c, I t, bool backward) {
  const ModelConfig& m = c.model;
  const I nh = m.num_attention_heads, d = m.head_dim;
  if (!c.cpu) {
    if (!backward) return 0;
    const bool mma = (c.dtype == DType::kBF16 || c.dtype == DType::kF16) && (d == 64 || d == 128) &&
                     m.attn_logit_softcapping == 0;
    return mma ? 4 * t * nh * d + 2 * 4 * nh * t : (c.dtype == DType::kF64 ? 8 : 4) * nh * t;
  }
  const I seq = c.attention_seqlen > 0 ? c.attention_seqlen : c.max_seqlen;
  const I len = std::max<I>(1, std::min(seq > 0 ? seq : t, t));
  const I bq = std::min<I>(64, len), acc = c.dtype == DType::kF64 ? 8 : 4;
  const I tasks = (t + len - 1) / len * (backward ? m.num_key_value_heads : nh);
  const I threads = std::max<I>(1, std::min<I>(c.blas_threads, tasks));
  const I slab = backward ? 4 * len * d + 3 * bq * d +
                                (m.attn_logit_softcapping > 0 ? 3 : 2) * bq * len + 2 * bq
                          : 2 * len * d + 2 * bq * d + bq * len;
  return threads * slab * acc;
}

// One decoder layer under sequence tiling (models/sequence_tiling.h), blocks of `chunk` rows:
// what it keeps for backward (attention's q, k, v, output and lse: the regions keep only their
// inputs, the layer's input and attention's output), and the bytes live at its widest moment of
// forward and of backward, that kept set included:
//   forward   attention (q, k, v, out, lse and its workspace), or the region after it: the kept
//             set, the layer's output and one block's o_proj output, h1, normed input, gate, up,
//             activation and MLP output;
//   backward  the MLP region: the kept set, the output's gradient, attention output's and the
//             input's gradients being filled, one block recomputed and its backward (gate, up,
//             activation and the gradients of all three, the block's [c x hidden] rows);
//             attention: the kept set, the gradients of its output and of the layer input, dQ, dK,
//             dV and its workspace; the region before it: dQ, dK, dV, the two gradients of the
//             layer input and one block's normed input, q/k/v before and after rope and their
//             gradients.
// What the families add inside a block, as the untiled walk counts it for the whole sequence:
// q/k norms (Qwen3, Gemma 3) keep q and k before the norm and an f32 rstd per head, and
// backward passes their gradients through the norm; a fused qkv_proj (Phi-3) keeps its whole
// [c x (q + 2 kv)] output, whose gradient is assembled in one buffer; a fused gate_up_proj
// keeps its [c x 2 inter] output beside the contiguous gate and up (and in backward their
// assembled gradient); the sandwich norms (Gemma 3) keep the attention and MLP outputs they
// normalise (in backward one [c x hidden] set more). GeGLU keeps what SwiGLU keeps.
// A trained weight's gradient is summed over the blocks: one block's gradient of the largest
// weight in flight, and for 16-bit weights the f32 sums of the region's weights.
struct TiledLayer {
  I saved = 0, forward = 0, backward = 0;
};

TiledLayer tiled_layer(const EstimateConfig& c, I t, I chunk, I ring_fwd, I ring_bwd) {
  const ModelConfig& m = c.model;
  const I b = static_cast<I>(dtype_size(c.dtype));
  const I h = m.hidden_size, inter = m.intermediate_size, d = m.head_dim;
  const I nq = m.num_attention_heads * d, nkv = m.num_key_value_heads * d, qkv_cols = nq + 2 * nkv;
  const I th = t * h * b, qkv = t * qkv_cols * b, attn = t * nq * b;
  const I lse = (c.dtype == DType::kF64 ? 8 : 4) * m.num_attention_heads * t;
  // 16-bit products on the CPU: f32 copies of a block's operands and of the weight.
  auto gemm = [&](I in, I out) {
    return c.cpu && b == 2 ? chunk * (in + out) * 4 + in * out * 4 : 0;
  };
  const I gu_cols = m.fused_gate_up ? 2 * inter : inter;
  const I gemm_a = gemm(h, m.fused_qkv ? qkv_cols : nq);
  const I gemm_bc = std::max(gemm(h, gu_cols), gemm(inter, h));
  I grads_a = 0, grads_bc = 0;
  if (!c.use_peft) {
    const I wa = qkv_cols * h, wbc = nq * h + 3 * inter * h;
    const I largest_a = m.fused_qkv ? qkv_cols * h : std::max(nq, nkv) * h;
    grads_a = b == 2 ? 4 * wa + largest_a * (4 + b) : largest_a * b;
    grads_bc = b == 2 ? 4 * wbc + gu_cols * h * (4 + b) : gu_cols * h * b;
  }
  // The families' additions to one block (above).
  const I qk_norm_block =
      m.qk_norm
          ? chunk * (nq + nkv) * b + 4 * chunk * (m.num_attention_heads + m.num_key_value_heads)
          : 0;
  const I fused_qkv_block = m.fused_qkv ? chunk * qkv_cols * b : 0;
  const I fused_mlp_block = m.fused_gate_up ? 2 * chunk * inter * b : 0;
  const I sandwich_block = m.sandwich_norms ? 2 * chunk * h * b : 0;
  TiledLayer r;
  r.saved = qkv + attn + lse;
  const I block_bc_fwd =
      chunk * (3 * inter + 4 * h) * b + gemm_bc + fused_mlp_block + sandwich_block;
  r.forward =
      std::max(r.saved + attention_workspace(c, t, false) + ring_fwd, r.saved + th + block_bc_fwd);
  const I block_bc_bwd =
      chunk * (5 * inter + 3 * h) * b + gemm_bc + grads_bc + fused_mlp_block + sandwich_block / 2;
  const I block_a_bwd =
      chunk * (2 * h + 3 * qkv_cols) * b + gemm_a + grads_a + 2 * qk_norm_block + fused_qkv_block;
  const I at_mlp = r.saved + th + attn + th + block_bc_bwd;
  const I at_attention = r.saved + attn + th + qkv + attention_workspace(c, t, true) + ring_bwd;
  const I at_inputs = th + qkv + th + block_a_bwd;
  r.backward = std::max({at_mlp, at_attention, at_inputs});
  return r;
}

}  // namespace

nlohmann::json MemoryEstimate::to_json() const {
  return {{"params", params},
          {"grads", grads},
          {"optimizer", optimizer},
          {"optimizer_host", optimizer_host},
          {"activations", activations},
          {"loss", loss},
          {"workspace", workspace},
          {"peak", peak},
          {"peak_phase", peak_phase},
          {"peak_detail", peak_detail},
          {"outside_allocator", outside_allocator},
          {"blas_buffers", blas_buffers},
          {"offloaded_host", offloaded_host},
          {"rss_peak", rss_peak},
          {"loading_rss", loading_rss},
          {"tiling_chunk", tiling_chunk},
          {"trainable_parameters", trainable_parameters},
          {"total_parameters", total_parameters}};
}

namespace {

// The walk: bytes live on the device allocator, the highest point and where it fell.
struct Walk {
  I live = 0, peak = 0;
  std::string phase, detail;
  // `extra` bytes live on top of `live` for a moment.
  void at(const char* ph, const std::string& what, I extra = 0) {
    if (live + extra > peak) {
      peak = live + extra;
      phase = ph;
      detail = what;
    }
  }
};

std::string layer_name(int64_t l) { return "layer " + std::to_string(l); }

}  // namespace

int64_t rank_tokens(const EstimateConfig& c) {
  const int64_t t = std::max<int64_t>(c.micro_batch_tokens, 1);
  if (c.cp_size <= 1) return t;
  const int64_t len = std::max<int64_t>(1, std::min(c.max_seqlen > 0 ? c.max_seqlen : t, t));
  const I sequences = (I(t) + len - 1) / len, m = I(c.cp_size) * 2;
  return (sequences * ((I(len) + m - 1) / m * m) / c.cp_size).get();
}

namespace {

// MemoryEstimate's sizes while the walk computes them, checked.
struct Sizes {
  I params, grads, optimizer, optimizer_host, activations, loss, workspace, peak;
  I trainable_parameters, total_parameters, outside_allocator, blas_buffers, offloaded_host,
      loading_rss, rss_peak;
};

}  // namespace

MemoryEstimate estimate_memory(const EstimateConfig& c) {
  const ModelConfig& m = c.model;
  Sizes e;
  const I b = static_cast<int64_t>(dtype_size(c.dtype));
  const I t = rank_tokens(c);
  const I h = m.hidden_size, v = m.vocab_size, l = m.num_hidden_layers;
  const I nq = m.num_attention_heads * m.head_dim, nkv = m.num_key_value_heads * m.head_dim;
  const I inter = m.intermediate_size;
  // A sequence classifier (reward model) has the score head [num_labels, H] instead of the LM
  // head: never tied, always trained (modules_to_save under PEFT), and no vocabulary-wide loss.
  const bool seq_cls = m.sequence_classification;
  const bool tied = m.tie_word_embeddings && !seq_cls;
  const bool head_trains = seq_cls || !c.use_peft || listed(c.lora_modules_to_save, "lm_head") ||
                           (tied && listed(c.lora_modules_to_save, "embed_tokens"));
  const bool embed_trains =
      !c.use_peft || listed(c.lora_modules_to_save, "embed_tokens") || (tied && head_trains);

  // ---- parameters and what trains
  I layer_params = 0, layer_trainable = 0;
  const I norms = m.layer_norm_parameters();
  I layer_param_bytes = norms * b;
  if (!c.use_peft || listed(c.lora_modules_to_save, "input_layernorm")) layer_trainable += norms;
  for (const ModuleShape& s : layer_modules(m)) {
    const I n = s.in * s.out;
    layer_params += n + (s.bias ? s.out : 0);
    layer_param_bytes += quantized_bytes(n, s.out, c, n * b) + (s.bias ? s.out * b : 0);
    if (!c.use_peft) {
      layer_trainable += n + (s.bias ? s.out : 0);
    } else if (targeted(c.lora_target_modules, s.kind)) {
      const I lora = c.lora_r * (s.in + s.out);
      layer_param_bytes += lora * b;
      layer_trainable += lora;
    }
  }
  layer_params += norms;
  const I layer_grad_bytes = layer_trainable * b;
  I largest_layer_weight = 0;
  for (const ModuleShape& s : layer_modules(m))
    largest_layer_weight = std::max(largest_layer_weight, s.in * s.out * b);
  const I embed = v * h, head = seq_cls ? m.num_labels * h : tied ? 0 : v * h;
  e.total_parameters = embed + head + h + l * layer_params;
  e.params = (embed + head + h) * b + l * layer_param_bytes + c.trainable_tokens * h * b;
  e.trainable_parameters = l * layer_trainable + c.trainable_tokens;
  if (embed_trains) e.trainable_parameters += embed;
  if (head_trains && head > 0) e.trainable_parameters += head;
  if (!c.use_peft) e.trainable_parameters += h;  // final norm
  // The head's gradient comes out of the loss in the weight's dtype (the embedding's, when tied).
  const I head_grad = head_trains ? (seq_cls ? head : v * h) * b : 0;
  const I embed_grad = embed_trains ? embed * b : 0;
  const I small_grads = (!c.use_peft ? h * b : 0) + c.trainable_tokens * h * b;
  e.grads = l * layer_grad_bytes + head_grad + (tied && head_trains ? 0 : embed_grad) + small_grads;
  e.optimizer = optimizer_state_bytes(c, e.trainable_parameters, b, m);
  const bool paged = c.optim.rfind("paged_", 0) == 0;
  // Host-resident, paged in slab by slab (on the CPU the host is the device).
  if (paged && !c.cpu) {
    e.optimizer_host = e.optimizer;
    e.optimizer = 0;
  }
  if (c.offload_optimizer) {  // f32 master weights and states on the host
    const I host =
        optimizer_state_bytes(c, e.trainable_parameters, 4, m) + 4 * e.trainable_parameters;
    // On the CPU the host is the device: the shadows are in the allocator's peak.
    e.optimizer_host = c.cpu ? 0 : host;
    e.optimizer = c.cpu ? host : 0;
  }
  const I ranks = std::max<I>(1, c.world_size);
  // ZeRO 3: parameters above the persistence threshold sharded; the outer unit gathered for the
  // whole step, one layer's at each moment of forward and backward (gathered_layer).
  I gathered_layer = 0;
  if (ranks > 1 && c.zero_stage >= 3) {
    const I thr = c.stage3_param_persistence_threshold;
    // n elements of `bytes` (n * b when dense), sharded or whole by their element count.
    auto split = [&](I n, I& big, I& small, I bytes = -1) {
      (n > thr ? big : small) += bytes < 0 ? n * b : bytes;
    };
    I layer_big = 0, layer_small = 0, outer_big = 0, outer_small = 0;
    for (I n : layer_norms(m)) split(n, layer_big, layer_small);
    for (const ModuleShape& s : layer_modules(m)) {
      const I n = s.in * s.out;  // a quantized base is sharded as one parameter
      split(n, layer_big, layer_small, quantized_bytes(n, s.out, c, n * b));
      if (s.bias) split(s.out, layer_big, layer_small);
    }
    split(embed, outer_big, outer_small);
    if (head > 0) split(head, outer_big, outer_small);
    split(h, outer_big, outer_small);
    // LoRA adapters and trainable-token rows are not model parameters: kept whole.
    const I adapters = e.params - (l * (layer_big + layer_small) + outer_big + outer_small);
    e.params = (l * layer_big + outer_big + ranks - 1) / ranks + l * layer_small + outer_small +
               adapters + outer_big;
    gathered_layer = layer_big;
  }
  const bool sharded = ranks > 1 && c.zero_stage >= 1;
  const bool grads_sharded = ranks > 1 && c.zero_stage >= 2;
  if (sharded) e.optimizer = (e.optimizer + ranks - 1) / ranks;
  const bool in_bwd = c.optimizer_in_backward;
  // Row-block updates (sft under optimizer_in_backward): the untied head inside the fused loss,
  // one block of its gradient at a time in f32 (plus its copy in the weight's dtype), and the
  // untied embedding in backward, one block in its dtype.
  const bool head_blocks =
      c.row_block_updates && in_bwd && c.fused_loss && head_trains && !tied && !seq_cls;
  const bool embed_blocks = c.row_block_updates && in_bwd && embed_trains && !tied;
  const I head_block_rows = std::min(v, I(kernels::weight_grad_block_rows(h.get())));
  const I head_block_grad = head_blocks ? head_block_rows * h * (4 + (b == 2 ? 2 : 0)) : 0;
  const I embed_block_grad = embed_blocks ? head_block_rows * h * b : embed * b;
  if (in_bwd) {
    // One gradient in flight: the largest trainable one, and the head's part of a tied
    // embedding's while the lookup's part is pending.
    I largest = !c.use_peft ? std::max(inter * h, nq * h) * b : 0;
    if (head_trains) largest = std::max(largest, head_blocks ? head_block_grad : head_grad);
    if (embed_trains && !tied) largest = std::max(largest, embed_block_grad);
    e.grads = std::min(e.grads, largest + (tied && head_trains ? head_grad : 0));
  }
  // A paged optimizer pages the states in slabs of kPagedSlabElements through two device
  // buffers (the next slab's copy overlaps this one's update).
  const I largest_param =
      (embed_trains || (head_trains && !seq_cls)) ? v * h : std::max(inter, nq) * h;
  const I paged_ws = paged && !c.offload_optimizer && !c.cpu
                         ? 2 * optimizer_state_bytes(
                                   c, std::min<I>(largest_param, kernels::kPagedSlabElements), 4, m)
                         : 0;

  // ---- what one decoder layer keeps for backward (beyond its input, counted as the previous
  // layer's output), read off the ops: rms_norm keeps its input and an f32 rstd, attention its
  // roped q and k, v, output and an f32 lse per head, swiglu gate and up, a linear its input when
  // its weight trains, a LoRA adapter its input and the [t x r] product x A^T.
  const I th = t * h * b;
  bool qkv_input = false, gu_input = false, down_input = false;
  I lora_u = 0;
  for (const ModuleShape& s : layer_modules(m)) {
    const bool lora = c.use_peft && targeted(c.lora_target_modules, s.kind);
    if (lora) lora_u += t * c.lora_r * b;
    if (c.use_peft && !lora) continue;
    if (s.kind == "q_proj" || s.kind == "k_proj" || s.kind == "v_proj" || s.kind == "qkv_proj")
      qkv_input = true;
    if (s.kind == "gate_proj" || s.kind == "up_proj" || s.kind == "gate_up_proj") gu_input = true;
    if (s.kind == "down_proj") down_input = true;
  }
  I saved = (m.sandwich_norms ? 4 : 2) * 4 * t;         // the layer norms' rstd
  saved += t * (nq + 2 * nkv + nq) * b;                 // attention: q, k, v, out
  saved += 4 * m.num_attention_heads * t;               // lse
  saved += th;                                          // h1, the second norm's input
  saved += 2 * t * inter * b;                           // swiglu / geglu: gate, up
  saved += (qkv_input ? th : 0) + (gu_input ? th : 0);  // normed inputs of trained projections
  saved += (down_input ? t * inter * b : 0) + lora_u;
  // Gemma's sandwich norms keep the attention and MLP outputs they normalise.
  if (m.sandwich_norms) saved += 2 * th;
  // q/k norms keep q and k before the norm and an f32 rstd per head.
  if (m.qk_norm)
    saved += t * (nq + nkv) * b + 4 * t * (m.num_attention_heads + m.num_key_value_heads);
  // Phi-3: attention keeps v as a view of the fused qkv output, which so stays whole.
  if (m.fused_qkv) saved += t * (nq + nkv) * b;
  // A layer's forward beyond what it keeps: the normed inputs and the swiglu output nobody
  // saves, a projection's output before the residual add; 16-bit GEMMs on the CPU read f32
  // copies of both operands and write an f32 output.
  I gemm_ws = 0;
  if (c.cpu && b == 2)
    for (const ModuleShape& s : layer_modules(m))
      gemm_ws = std::max(gemm_ws, t * (s.in + s.out) * 4 + s.in * s.out * 4);
  // The zigzag ring (cp_size > 1): forward holds two KV buffers of the rank's rows and one
  // block's output and lse; backward the two KV buffers, the two dK/dV buffers of the second
  // ring and one block's dQ/dK/dV (kernels/ring_attention.cpp), the MLP's workspace gone by then.
  const bool ring = c.cp_size > 1;
  const I ring_fwd = ring ? 2 * 2 * t * nkv * b + t * nq * b + 4 * m.num_attention_heads * t : 0;
  const I ring_bwd = ring ? 4 * 2 * t * nkv * b + t * (nq + 2 * nkv) * b : 0;
  // Phi-3's fused gate_up output is split into strided views that the activation copies
  // contiguous (forward), and whose gradients are assembled into one [t, 2 inter] buffer beside
  // them (backward).
  const I fused_mlp = m.fused_gate_up ? 2 * t * inter * b : 0;
  I fwd_ws =
      (gu_input ? 0 : th) + (down_input ? 0 : t * inter * b) + th + gemm_ws + ring_fwd + fused_mlp;
  // One layer's backward at its widest, the MLP: the gradients of gate and up beside the
  // gradient of the layer output and of the norm input (or the ring's backward buffers).
  // Gemma's sandwich norms add the gradients of the normalised attention and MLP outputs.
  I bwd_ws = std::max(2 * t * inter * b + fused_mlp, ring_bwd) + 2 * th + gemm_ws +
             (m.sandwich_norms ? 2 * th : 0);
  const bool offload = c.activation_offloading, ckpt = c.gradient_checkpointing;
  // Sequence tiling (models/sequence_tiling.h): the layer keeps attention's q, k, v, output and
  // lse; the rest of it exists for one block of rows at a time (tiled_layer below).
  const int64_t tile = tiling_chunk_tokens(c.tiling, m, t.get());
  if (tile > 0) {
    const TiledLayer tl = tiled_layer(c, t, tile, ring_fwd, ring_bwd);
    saved = tl.saved;
    fwd_ws = tl.forward - (ckpt ? saved : 0);
    bwd_ws = tl.backward - saved;
  }
  // Bytes a layer leaves on the device until its backward: its output (the next layer's input),
  // and what it saves unless checkpointing recomputes it. Offloading moves both to host memory,
  // except the last layer's output, which the final norm saves outside offloading.
  const I kept = (offload ? 0 : th) + ((ckpt || offload) ? 0 : saved);
  const I embed_out = offload ? 0 : th, last_out = offload ? th : 0;
  // On CUDA a saved tensor leaves the device only once its copy has landed: up to five copies
  // in flight (OffloadOptions::max_fwd_stash_size), each at most a layer's largest saved tensor.
  const I stash =
      offload && !c.cpu ? std::min<I>(5, l) * (ckpt ? th : std::max(th, t * inter * b)) : 0;
  e.activations = embed_out + l * kept + last_out + th + 4 * t;  // ..., final norm

  // ---- the walk over one optimizer step in the steady state (optimizer state exists)
  const I accumulated = c.gradient_accumulation_steps > 1 ? e.grads : 0;
  Walk w;
  w.live = e.params + e.optimizer + accumulated;
  w.live += embed_out;
  for (int64_t i = 0; i < l; ++i) {
    w.at("forward", layer_name(i), (ckpt ? saved : 0) + fwd_ws + stash + gathered_layer);
    w.live += kept;
  }
  w.live += last_out + th + 4 * t;  // the last layer's output kept; final norm: output, rstd
  // The loss: the fused kernel runs forward and backward of the head chunk by chunk and keeps
  // dhidden and the head's gradient (in the weight's dtype). Its workspace on the CPU: a [chunk x
  // vocab] f32 logits block, f32 [chunk x hidden] rows and, for a 16-bit head, f32 blocks of
  // about 16 MiB of the weight and of its gradient (never a whole f32 copy); on CUDA: the chunk's
  // logits in the weight's dtype (chunks capped at 768 MiB of logits), gathered rows and
  // cuBLASLt's workspace (32 MiB).
  const I chunk = std::min<I>(c.loss_chunk_tokens, t);
  I loss_held, loss_ws;
  if (seq_cls) {
    // The score rows [B, H] and their gradient: nothing of vocabulary size.
    loss_held = th + head_grad;
    loss_ws = 0;
  } else if (head_blocks) {
    // linear_cross_entropy_weight_blocks: dhidden held; as workspace the rows' lse, target
    // logits and targets, a [chunk x block] f32 logits block, dhidden in f32, the block's
    // gradient, and the f32 copies of 16-bit GEMM operands (a block of the head, a chunk of
    // hidden rows); the optimizer's update of each block runs inside (paged: its slabs).
    loss_held = th;
    const I rows = std::min<I>(chunk, t);
    loss_ws = 16 * t + rows * head_block_rows * 4 + t * h * 4 + head_block_grad +
              (b == 2 ? head_block_rows * h * 4 + rows * h * 4 : 0) + paged_ws +
              (c.cpu ? 0 : int64_t{32} << 20);
  } else if (c.fused_loss) {
    loss_held = th + head_grad;
    if (c.cpu) {
      const I wblock = b == 2 ? std::min<I>(v, (int64_t{4} << 20) / h) * h * 4 : 0;
      loss_ws = chunk * v * 4 + 2 * chunk * h * 4 + wblock * (head_trains ? 2 : 1);
    } else {
      const I rows = std::min<I>(chunk, std::max<I>(1, (int64_t{768} << 20) / (v * b + 2 * h * b)));
      loss_ws = rows * v * b + 2 * rows * h * b + 12 * t + (int64_t{32} << 20);
    }
  } else {
    loss_held = t * v * b;  // logits
    loss_ws = t * v * 4;    // f32 softmax rows, which become the gradient
  }
  e.loss = loss_held;
  w.live += loss_held;
  w.at("loss", seq_cls ? "score head" : "fused linear cross-entropy", loss_ws + stash);
  w.live -= th;  // the final norm's output dies with the loss' forward
  // optimizer_in_backward: an untied head is updated first in backward and its gradient freed.
  if (in_bwd && head_trains && !tied && !head_blocks) w.live -= head_grad;
  // The fused loss' dhidden goes back through the final norm before the last layer's backward,
  // where the gradient of the layer's output stands for it (in bwd_ws).
  if (!seq_cls && (c.fused_loss || head_blocks)) w.live -= th;
  // The final norm's backward releases its input, the last layer's output (kept outside
  // offloading; without offloading it is that layer's `kept`, discounted in its backward).
  w.live -= last_out;
  // Backward, last layer first: a layer's gradients appear, what it kept goes.
  for (int64_t i = l.get() - 1; i >= 0; --i) {
    // Without offloading the walk still counts this layer's output (`kept`), which the next
    // layer (or the final norm) released in its own backward.
    I in_flight = bwd_ws + gathered_layer - (offload ? 0 : th);
    if (ckpt)
      in_flight += saved;  // recomputed
    else if (offload)
      in_flight += 2 * saved;          // this layer and the one prefetched
    if (offload) in_flight += 2 * th;  // the inputs of this layer and of the one prefetched
    // Gradients in flight: the layer's, or under optimizer_in_backward one weight's at a time
    // (each is applied and freed as it completes, in a recomputed layer's inner backward too).
    const I layer_grads =
        accumulated > 0
            ? 0
            : (in_bwd ? std::min(layer_grad_bytes, largest_layer_weight) : layer_grad_bytes);
    w.at("backward", layer_name(i), in_flight + layer_grads + (in_bwd ? paged_ws : 0));
    // ZeRO 2 reduce-scatters each completed unit: 1/N of its gradients stays.
    const I stays = grads_sharded ? (layer_grad_bytes + ranks - 1) / ranks : layer_grad_bytes;
    w.live += (accumulated > 0 || in_bwd) ? 0 : stays;
    w.live -= kept;
  }
  // The embedding: its dense gradient (with tied weights summed in place into the head's, which
  // backward holds alone by then), and under a paged optimizer with optimizer_in_backward the
  // slabs of its states.
  if (embed_trains) {
    // By blocks: one block's gradient and the gathered gradient rows of its tokens (at most all).
    const I grad = embed_blocks ? embed_block_grad + th : embed_grad;
    w.at("backward", "embedding", grad + (in_bwd ? paged_ws : 0));
  }
  // Data parallel: each unit of gradients is reduced through a flat copy (kComm).
  const I grads_live = grads_sharded ? (e.grads + ranks - 1) / ranks : e.grads;
  if (ranks > 1) {
    const I unit = std::min(e.grads, c.reduce_bucket_size * b);
    Walk red = w;
    red.live = e.params + e.optimizer + (grads_sharded ? grads_live : e.grads);
    red.at("gradient reduction", "one unit's flat copy", unit * (c.deterministic_comm ? 3 : 1));
    if (red.peak > w.peak) w = red;
  }
  // The optimizer step of the first update creates the state while every gradient is live
  // (inside backward with optimizer_in_backward, one gradient at a time).
  Walk first = w;
  first.live = e.params + grads_live + e.optimizer;
  first.at(in_bwd ? "backward" : "optimizer step", "first update: optimizer state created",
           paged_ws);
  if (first.peak > w.peak) w = first;
  e.peak = w.peak;
  // ---- host resident memory
  const bool weight_grads = !c.use_peft;
  e.blas_buffers = c.cpu ? I(c.blas_threads) * (weight_grads ? 31 : 3) * (int64_t{1} << 20) : 0;
  e.offloaded_host = offload ? l * (th + (ckpt ? 0 : saved)) : 0;
  e.outside_allocator = c.resident_before_training + e.blas_buffers;
  // Cached blocks: 12% of the peak in f32 runs; a bf16 run (the head and its gradient never
  // converted whole, so no large f32 blocks are left cached) measured none.
  const I cached = b == 2 ? 0 : e.peak * 12 / 100;
  e.rss_peak = (c.cpu ? e.peak + cached : 0) + e.outside_allocator + e.offloaded_host;
  if (!c.cpu) {
    // On CUDA the host holds, besides what was resident before training and the pinned pool of
    // offloaded activations: the optimizer states kept on the host (paged or offloaded), and
    // while loading, the streaming loader's one tensor in flight (loaders/safetensors.h: a
    // tensor's file pages are released once it is on the device), at most the largest weight
    // (the embedding or the head, or a layer's largest projection) in its dense dtype.
    e.rss_peak += e.optimizer_host;
    e.loading_rss = c.resident_before_training + std::max(v * h * b, largest_layer_weight);
    e.rss_peak = std::max(e.rss_peak, e.loading_rss);
  }
  if (grads_sharded) e.grads = grads_live;
  e.workspace = std::max<I>(0, e.peak - e.params - e.optimizer - e.grads - e.activations - e.loss);
  MemoryEstimate out;
  out.params = e.params.get();
  out.grads = e.grads.get();
  out.optimizer = e.optimizer.get();
  out.optimizer_host = e.optimizer_host.get();
  out.activations = e.activations.get();
  out.loss = e.loss.get();
  out.workspace = e.workspace.get();
  out.peak = e.peak.get();
  out.peak_phase = w.phase;
  out.peak_detail = w.detail;
  out.trainable_parameters = e.trainable_parameters.get();
  out.total_parameters = e.total_parameters.get();
  out.outside_allocator = e.outside_allocator.get();
  out.blas_buffers = e.blas_buffers.get();
  out.offloaded_host = e.offloaded_host.get();
  out.rss_peak = e.rss_peak.get();
  out.loading_rss = e.loading_rss.get();
  out.tiling_chunk = tile;
  return out;
}

}  // namespace leantune

#include <omp.h>

#include "loaders/options.h"
#include "models/peft_io.h"
#include "models/quantize_model.h"
#include "trainers/common/model_source.h"
#include "trainers/common/optim_options.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/common/trainer.h"
#include "trainers/sft/sft.h"

namespace leantune {

EstimateConfig estimate_config(const ModelConfig& model, const TrainingArguments& args,
                               const PeftConfig* peft, const QuantConfig& quant, bool fused_loss,
                               int64_t max_length, bool cpu, int64_t micro_batch_tokens,
                               int64_t max_seqlen) {
  EstimateConfig c;
  c.model = model;
  c.dtype = args.bf16 ? DType::kBF16 : DType::kF32;
  c.cpu = cpu;
  const int64_t length = max_length > 0 ? max_length : model.max_position_embeddings;
  c.micro_batch_tokens = micro_batch_tokens > 0
                             ? micro_batch_tokens
                             : (I(args.per_device_train_batch_size) * length).get();
  c.max_seqlen = max_seqlen > 0 ? max_seqlen : length;
  c.gradient_accumulation_steps = args.gradient_accumulation_steps;
  c.gradient_checkpointing = args.gradient_checkpointing;
  c.tiling = args.tiling;
  c.activation_offloading = args.activation_offloading;
  c.min_offload_size = args.min_offload_size;
  c.fused_loss = fused_loss;
  c.use_peft = peft != nullptr;
  if (peft) {
    c.lora_r = peft->r;
    c.lora_target_modules = peft->target_modules;
    c.lora_modules_to_save = peft->modules_to_save;
    c.trainable_tokens = static_cast<int64_t>(peft->trainable_token_indices.size());
  }
  c.load_in_4bit = quant.load_in_4bit;
  c.load_in_8bit = quant.load_in_8bit;
  c.double_quant = quant.double_quant;
  c.optim = args.optim;
  c.optimizer_in_backward = args.optimizer_in_backward;
  c.offload_optimizer = args.offload_optimizer == "cpu";
  c.blas_threads = omp_get_max_threads();
  c.zero_stage = args.zero_stage;
  c.stage3_param_persistence_threshold = args.stage3_param_persistence_threshold;
  c.reduce_bucket_size = args.reduce_bucket_size;
  c.deterministic_comm = args.comm.deterministic;
  c.cp_size = args.cp_size;
  return c;
}

EstimateConfig estimate_config_from_options(const Options& o, const ModelConfig& model, bool cpu) {
  const TrainingArguments args = training_arguments(o);
  const PeftArguments peft = peft_table().read(o);
  const QuantConfig quant = quant_config_from_options(o, args.bf16 ? DType::kBF16 : DType::kF32);
  const SftArguments sft = sft_table().read(o);
  EstimateConfig c = estimate_config(model, args, peft.use_peft ? &peft.config : nullptr, quant,
                                     sft.use_liger_kernel, sft.max_length.value_or(0), cpu);
  c.row_block_updates = args.optimizer_in_backward && optim_updates_rows(args.optim);
  return c;
}

const OptionTable<EstimateRanks>& world_size_table() {
  static const OptionTable<EstimateRanks> t = OptionTable<EstimateRanks>().integer(
      "world_size", &EstimateRanks::world_size,
      "ranks of the run (data parallel; with --zero_stage, the per-rank peak of the sharded "
      "states)",
      1);
  return t;
}

std::optional<EstimateTarget> parse_estimate_target(Options& o,
                                                    const std::vector<std::string>& args) {
  if (!o.parse(args)) {
    std::printf("%s", o.help().c_str());
    return std::nullopt;
  }
  std::string path = model_folder(model_source(o));  // a Hub ID: its cached snapshot
  if (path.empty()) path = embedded_data_dir() + "/config.json";
  ModelConfig model = ModelConfig::load(path);
  return EstimateTarget{path, std::move(model), Device::parse(training_table().read(o).device)};
}

}  // namespace leantune
