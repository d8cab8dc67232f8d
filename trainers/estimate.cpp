#include "trainers/estimate.h"

#include <algorithm>
#include <cmath>

namespace leantune {

namespace {

struct ModuleShape {
  std::string kind;  // q_proj, ...
  int64_t in, out;
  bool bias;
};

std::vector<ModuleShape> layer_modules(const ModelConfig& m) {
  const int64_t h = m.hidden_size, i = m.intermediate_size, d = m.head_dim;
  const int64_t nq = m.num_attention_heads * d, nkv = m.num_key_value_heads * d;
  return {{"q_proj", h, nq, m.attention_bias},  {"k_proj", h, nkv, m.attention_bias},
          {"v_proj", h, nkv, m.attention_bias}, {"o_proj", nq, h, m.o_proj_bias},
          {"gate_proj", h, i, m.mlp_bias},      {"up_proj", h, i, m.mlp_bias},
          {"down_proj", i, h, m.mlp_bias}};
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

int64_t quantized_bytes(int64_t n, int64_t rows, const EstimateConfig& c, int64_t dense) {
  if (c.load_in_4bit) {
    const int64_t blocks = (n + 63) / 64;
    const int64_t absmax = c.double_quant ? blocks + ((blocks + 255) / 256) * 4 + 4 : blocks * 4;
    return (n + 1) / 2 + absmax;
  }
  if (c.load_in_8bit) return n + rows * 4;
  return dense;
}

// Optimizer state of `trainable` parameters in dtype b (b == 4: no master needed).
int64_t optimizer_state_bytes(const EstimateConfig& c, int64_t trainable, int64_t b,
                              const ModelConfig& m) {
  const int64_t master = b == 2 ? 4 * trainable : 0;
  if (c.optim == "adamw_8bit" || c.optim == "adamw_bnb_8bit" || c.optim == "paged_adamw_8bit")
    return 2 * trainable + trainable / 32;
  if (c.optim == "paged_adamw_32bit") return 8 * trainable;
  if (c.optim == "sgd") return master;
  if (c.optim == "adafactor") {
    // Row and column f32 statistics of each trained matrix, the full second moment of vectors.
    int64_t rc = 0;
    for (const ModuleShape& s : layer_modules(m)) {
      if (!c.use_peft)
        rc += s.in + s.out + (s.bias ? s.out : 0);
      else if (targeted(c.lora_target_modules, s.kind))
        rc += (c.lora_r + s.in) + (s.out + c.lora_r);
    }
    rc = rc * m.num_hidden_layers +
         (!c.use_peft ? (2 * m.num_hidden_layers + 1) * m.hidden_size : 0);
    if (!c.use_peft) rc += (m.tie_word_embeddings ? 1 : 2) * (m.vocab_size + m.hidden_size);
    return 4 * rc;
  }
  return 8 * trainable + master;  // adamw_torch
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
          {"trainable_parameters", trainable_parameters},
          {"total_parameters", total_parameters}};
}

MemoryEstimate estimate_memory(const EstimateConfig& c) {
  const ModelConfig& m = c.model;
  MemoryEstimate e;
  const int64_t b = static_cast<int64_t>(dtype_size(c.dtype));
  const int64_t t = std::max<int64_t>(c.micro_batch_tokens, 1);
  const int64_t h = m.hidden_size, v = m.vocab_size, l = m.num_hidden_layers;
  const int64_t nq = m.num_attention_heads * m.head_dim, nkv = m.num_key_value_heads * m.head_dim;
  const int64_t inter = m.intermediate_size;
  const bool quant = c.load_in_4bit || c.load_in_8bit;
  const bool head_trains =
      !c.use_peft || listed(c.lora_modules_to_save, "lm_head") ||
      (m.tie_word_embeddings && listed(c.lora_modules_to_save, "embed_tokens"));
  const bool embed_trains = !c.use_peft || listed(c.lora_modules_to_save, "embed_tokens") ||
                            (m.tie_word_embeddings && head_trains);

  // ---- parameters and what trains
  int64_t layer_params = 0, layer_trainable = 0, layer_grad_bytes = 0;
  int64_t layer_param_bytes = 2 * h * b;  // the two norms
  if (!c.use_peft || listed(c.lora_modules_to_save, "input_layernorm")) layer_trainable += 2 * h;
  for (const ModuleShape& s : layer_modules(m)) {
    const int64_t n = s.in * s.out;
    layer_params += n + (s.bias ? s.out : 0);
    layer_param_bytes += quantized_bytes(n, s.out, c, n * b) + (s.bias ? s.out * b : 0);
    if (!c.use_peft) {
      layer_trainable += n + (s.bias ? s.out : 0);
    } else if (targeted(c.lora_target_modules, s.kind)) {
      const int64_t lora = c.lora_r * (s.in + s.out);
      layer_param_bytes += lora * b;
      layer_trainable += lora;
    }
  }
  layer_params += 2 * h;
  layer_grad_bytes = layer_trainable * b;
  const int64_t embed = v * h, head = m.tie_word_embeddings ? 0 : v * h;
  e.total_parameters = embed + head + h + l * layer_params;
  e.params = (embed + head + h) * b + l * layer_param_bytes + c.trainable_tokens * h * b;
  e.trainable_parameters = l * layer_trainable + c.trainable_tokens;
  if (embed_trains) e.trainable_parameters += embed;
  if (head_trains && head > 0) e.trainable_parameters += head;
  if (!c.use_peft) e.trainable_parameters += h;  // final norm
  // The head's gradient arrives from the fused loss in f32 (the embedding's, when tied).
  const int64_t head_grad = head_trains ? v * h * (c.fused_loss ? 4 : b) : 0;
  const int64_t embed_grad_extra = (embed_trains && !m.tie_word_embeddings) ? embed * b : 0;
  e.grads = l * layer_grad_bytes + head_grad + embed_grad_extra + (!c.use_peft ? h * b : 0) +
            c.trainable_tokens * h * b;
  e.optimizer = optimizer_state_bytes(c, e.trainable_parameters, b, m);
  if (c.optim.rfind("paged_", 0) == 0) {  // host-resident, paged in per parameter
    e.optimizer_host = e.optimizer;
    e.optimizer = 0;
  }
  if (c.offload_optimizer) {
    e.optimizer_host =
        optimizer_state_bytes(c, e.trainable_parameters, 4, m) + 4 * e.trainable_parameters;
    e.optimizer = 0;
  }
  if (c.optimizer_in_backward) {
    // One gradient in flight: the largest trainable one, and the head's part of a tied
    // embedding's while the lookup's part is pending.
    int64_t largest = !c.use_peft ? std::max(inter * h, nq * h) * b : 0;
    if (head_trains) largest = std::max(largest, v * h * (c.fused_loss ? 4 : b));
    if (embed_trains && !m.tie_word_embeddings) largest = std::max(largest, embed * b);
    e.grads = std::min(e.grads, largest + (m.tie_word_embeddings && head_trains ? head_grad : 0));
  }

  // ---- activations saved for backward, per layer
  int64_t per_layer = t * h * b + 4 * t;       // input_layernorm: x, rstd
  per_layer += t * h * b + 4 * t;              // post_attention_layernorm: h1, rstd
  per_layer += t * (nq + 2 * nkv + nq) * b;    // attention: q, k, v, out
  per_layer += 4 * m.num_attention_heads * t;  // lse
  per_layer += 2 * t * inter * b;              // swiglu: gate, up
  bool qkv_input = false, o_input = false, gu_input = false, down_input = false;
  int64_t lora_u = 0;
  for (const ModuleShape& s : layer_modules(m)) {
    const bool lora = c.use_peft && targeted(c.lora_target_modules, s.kind);
    const bool saves = !c.use_peft || lora;
    if (lora) lora_u += t * c.lora_r * b;
    if (!saves) continue;
    if (s.kind == "q_proj" || s.kind == "k_proj" || s.kind == "v_proj") qkv_input = true;
    if (s.kind == "o_proj") o_input = true;  // the attention output, already counted
    if (s.kind == "gate_proj" || s.kind == "up_proj") gu_input = true;
    if (s.kind == "down_proj") down_input = true;
  }
  (void)o_input;
  if (qkv_input) per_layer += t * h * b;
  if (gu_input) per_layer += t * h * b;
  if (down_input) per_layer += t * inter * b;
  per_layer += lora_u;
  const int64_t head_acts = t * h * b + 4 * t;  // final norm input and rstd
  int64_t acts;
  int64_t backward_layer_acts;  // activations of the layer whose backward runs, beyond acts
  if (c.activation_offloading) {
    // Tensors of layers in flight come back two at a time; the head stays.
    acts = head_acts;
    backward_layer_acts = c.gradient_checkpointing ? 2 * t * h * b + per_layer : 2 * per_layer;
  } else if (c.gradient_checkpointing) {
    acts = l * t * h * b + head_acts;
    backward_layer_acts = per_layer;  // recomputed for the layer in backward
  } else {
    acts = l * per_layer + head_acts;
    backward_layer_acts = 0;
  }
  e.activations = acts;

  // ---- loss
  const int64_t chunk = std::min<int64_t>(c.loss_chunk_tokens, t);
  int64_t loss_held, loss_ws;
  if (c.fused_loss) {
    loss_held = t * h * b;  // dhidden (the head's f32 gradient is counted in grads)
    loss_ws = chunk * v * 4 + 2 * chunk * h * 4 + (b == 2 ? v * h * 4 : 0);
  } else {
    loss_held = t * v * b;  // logits
    loss_ws = t * v * 4;    // f32 softmax rows, which become the gradient
  }
  e.loss = loss_held;

  // ---- transients
  // One layer's backward at its widest point, the MLP: the gradients of gate and up while the
  // gradient of the layer output and of the norm input are live (measured on the CPU backend:
  // the attention half of a layer's backward is narrower).
  const int64_t layer_bwd_ws = 2 * t * inter * b + 2 * t * h * b;
  // 16-bit GEMMs on the CPU read f32 copies of both operands and write an f32 output.
  int64_t gemm_ws = 0;
  if (c.cpu && b == 2)
    for (const ModuleShape& s : layer_modules(m))
      gemm_ws = std::max(gemm_ws, t * (s.in + s.out) * 4 + s.in * s.out * 4);
  const int64_t seq = std::max<int64_t>(c.max_seqlen, 1);
  const int64_t attn_ws = c.cpu ? 2 * 64 * seq * 4 * 2 : 0;

  // ---- peak over the step
  const int64_t grads_before = c.gradient_accumulation_steps > 1 ? e.grads : 0;
  const int64_t fwd =
      acts + std::max(loss_held + loss_ws, gemm_ws + attn_ws + t * inter * b) + grads_before;
  // Start of backward: everything saved, the loss's held gradients, the first layer's work.
  // A paged optimizer pages one parameter's states onto the device for its step (during
  // backward with optimizer_in_backward); the largest is the embedding's or the head's.
  const int64_t paged_ws =
      c.optim.rfind("paged_", 0) == 0 && !c.offload_optimizer
          ? optimizer_state_bytes(c, (embed_trains || head_trains) ? v * h : 0, 4, m)
          : 0;
  const int64_t bwd = acts + loss_held + (grads_before ? e.grads : head_grad) +
                      backward_layer_acts + layer_bwd_ws + gemm_ws + attn_ws +
                      (c.optimizer_in_backward ? paged_ws : 0);
  // End of backward: all gradients, little else.
  const int64_t bwd_end = e.grads + t * h * b + layer_bwd_ws;
  // The optimizer step: gradients and state, and the f32 conversion of one gradient.
  const int64_t opt = c.optimizer_in_backward ? 0 : e.grads + (b == 2 ? v * h * 4 : 0) + paged_ws;
  const int64_t train_max = std::max({fwd, bwd, bwd_end});
  e.peak = e.params + e.optimizer + std::max(train_max, opt);
  e.peak_phase =
      opt > train_max ? "optimizer step" : (fwd >= std::max(bwd, bwd_end) ? "forward" : "backward");
  e.workspace = (e.peak - e.params - e.optimizer) -
                (e.peak_phase == "forward"    ? acts + loss_held + grads_before
                 : e.peak_phase == "backward" ? acts + loss_held + e.grads
                                              : e.grads);
  if (e.workspace < 0) e.workspace = 0;
  (void)quant;
  return e;
}

}  // namespace leantune

#include "trainers/options.h"

namespace leantune {

EstimateConfig estimate_config_from_options(const Options& o, const ModelConfig& model, bool cpu,
                                            int64_t micro_batch_tokens, int64_t max_seqlen) {
  EstimateConfig c;
  c.model = model;
  c.dtype = o.get_bool("bf16") ? DType::kBF16 : DType::kF32;
  c.cpu = cpu;
  const int64_t max_length =
      o.get_int_or_none("max_length").value_or(model.max_position_embeddings);
  c.micro_batch_tokens = micro_batch_tokens > 0
                             ? micro_batch_tokens
                             : o.get_int("per_device_train_batch_size") * max_length;
  c.max_seqlen = max_seqlen > 0 ? max_seqlen : max_length;
  c.gradient_accumulation_steps = o.get_int("gradient_accumulation_steps");
  c.gradient_checkpointing = o.get_bool("gradient_checkpointing");
  c.activation_offloading = o.get_bool("activation_offloading");
  c.min_offload_size = o.get_int("min_offload_size");
  c.fused_loss = o.get_bool("use_liger_kernel");
  c.use_peft = o.get_bool("use_peft");
  c.lora_r = o.get_int("lora_r");
  c.lora_target_modules = o.get_string_list("lora_target_modules");
  c.lora_modules_to_save = o.get_string_list("lora_modules_to_save");
  c.trainable_tokens = static_cast<int64_t>(o.get_string_list("trainable_token_indices").size());
  c.load_in_4bit = o.get_bool("load_in_4bit");
  c.load_in_8bit = o.get_bool("load_in_8bit");
  c.double_quant = o.get_bool("bnb_4bit_use_double_quant");
  c.optim = o.get_string("optim");
  c.optimizer_in_backward = o.get_bool("optimizer_in_backward");
  c.offload_optimizer = o.get_string("offload_optimizer") == "cpu";
  return c;
}

}  // namespace leantune
