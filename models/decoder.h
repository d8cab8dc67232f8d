// DecoderModel: the decoder-only transformer of every supported family (Llama, Qwen2, Qwen3,
// Mistral, Phi-3, Gemma 3 text), built from ModelConfig; the families differ only by the config's
// options (loaders/model_config.h), never by a copy of the decoder.
//
// Parameters carry Hugging Face names (model.embed_tokens.weight,
// model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight, lm_head.weight); with
// tie_word_embeddings the head is the embedding matrix and lm_head.weight is not a separate
// parameter. A *ForSequenceClassification config has `score.weight` [num_labels, H] instead of an
// LM head (models/score_head.h reads it). All parameters live on one device in one compute
// dtype, tagged MemTag::kParam.
//
// Forward takes a flat varlen Batch (loaders/batch.h). norm() is the family's RMSNorm (w, or
// (1 + w) in f32 with norm_unit_offset). Embedding (* sqrt(H) with scale_embeddings), then per
// layer:
//   x = norm(h); q,k,v = proj(x) (+bias; one qkv_proj split with fused_qkv);
//   q,k = norm per head (qk_norm); rope(q,k) (the layer's rope; longrope picks its factors by
//   the largest position); attention over cu_seqlens (causal, GQA, the layer's sliding window,
//   the family's scale and soft-cap); a = o_proj(attn) (norm(a) with sandwich_norms);
//   h = h + a; x = norm(h); m = down(act(gate(x), up(x))) (swiglu or geglu; one gate_up_proj
//   split with fused_gate_up) (pre-/post-feedforward norms with sandwich_norms); h = h + m
// then the final norm and the LM head (logits soft-capped with final_logit_softcapping). The
// loss is the causal-LM cross entropy over shifted labels, normalised by the caller's token count
// (micro-batch accumulation), computed by the fused chunked linear_cross_entropy unless logits
// are asked for.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/attention.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/ring_attention.h"
#include "kernels/rms_norm.h"
#include "loaders/batch.h"
#include "loaders/model_config.h"
#include "models/linear_module.h"
#include "models/sequence_tiling.h"

namespace leantune {

class TensorStore;

struct DecoderLayer {
  Tensor input_layernorm;                                        // [H]
  Tensor post_attention_layernorm;                               // [H]
  Tensor pre_feedforward_layernorm, post_feedforward_layernorm;  // [H], sandwich_norms only
  Tensor q_norm, k_norm;                                         // [head_dim], qk_norm only
  // q/k/v, or one qkv_proj (fused_qkv); gate/up, or one gate_up_proj (fused_gate_up). A module
  // the family does not have is left empty (no name).
  LinearModule q_proj, k_proj, v_proj, qkv_proj, o_proj, gate_proj, up_proj, gate_up_proj,
      down_proj;
  // The layer's projections, in Hugging Face order.
  std::vector<LinearModule*> linears();
  std::vector<const LinearModule*> linears() const;
  // The layer's normalisation weights with their names' last components ("input_layernorm",
  // "self_attn.q_norm", ...), in the order named_parameters lists them.
  std::vector<std::pair<const char*, Tensor>> norms() const;
};

// One layer's attention for layer_forward_with: q [T, Hq, D] and k, v [T, Hkv, D] after the
// projections and q/k norms, before rope -> attention output [T, Hq, D]. The caller applies the
// rope (DecoderModel::apply_rope) and attention (DecoderModel::attention_options) its own way:
// over a varlen batch in training, over the KV cache in generation.
using LayerAttention =
    std::function<Tensor(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v)>;

// Receives blocks of rows of a parameter's gradient as they complete (optimizer_in_backward's
// OptimizerInBackward::apply_rows; kernels/weight_grad_sink.h).
using RowGradSink = std::function<void(const Tensor& param, int64_t row0, const Tensor& grad_rows)>;

// Context parallelism (dist/context_parallel.h): the batch holds this rank's zigzag rows of
// a longer global batch, and attention is the zigzag ring over `comm` (every rank of the ring
// runs the same layers in the same order, forward, checkpoint recompute and backward alike).
// `comm` must outlive the backward.
struct ContextParallel {
  Communicator* comm = nullptr;
  kernels::ZigzagLayout layout;
};

// What a batch's cu_seqlens say, as attention's hints (kernels::AttentionOptions): the longest
// sequence and cu_seqlens[B], the rows inside sequences (0: unknown). A bare longest length
// converts, with the total unknown.
struct SeqHints {
  SeqHints(int64_t longest_len = 0, int64_t total_rows = 0)  // NOLINT(runtime/explicit)
      : longest(longest_len), total(total_rows) {}
  int64_t longest = 0;
  int64_t total = 0;
};
// b.max_seqlen (or the longest sequence of its cu_seqlens) and cu_seqlens[B], read from the host's
// cu_seqlens (a device one gives the total as unknown).
SeqHints seq_hints(const Batch& b);

struct ForwardOptions {
  bool need_loss = true;
  bool need_logits = false;  // full [T, V] logits (tests, generation, small models)
  double normalizer = 0;     // tokens the loss is divided by; 0 = this batch's label tokens
  bool gradient_checkpointing = false;
  bool fused_loss = true;  // chunked linear_cross_entropy instead of logits + cross_entropy
  int64_t loss_chunk_tokens = 1024;
  // When set, the untied LM head (with the fused loss, during forward: the loss must then be
  // backpropagated with d loss = 1) and the token embedding (during backward), where they train,
  // hand their gradients to this sink block by block instead of holding them whole.
  RowGradSink row_grad_sink;
  // Set: attention is the zigzag ring (the batch is this rank's rows; see ContextParallel).
  std::shared_ptr<const ContextParallel> context_parallel;
  // The batch's labels are already the next-token targets (context parallelism shifts them on
  // the global batch before the split); the loss does not shift them again.
  bool labels_shifted = false;
  // With the loss: ForwardResult's row statistics of the predicted distributions (TRL's SFT
  // entropy and mean_token_accuracy), where the loss path gives them (not the weight-block
  // loss of optimizer_in_backward, nor soft-capped logits on CUDA).
  bool row_stats = false;
};

// Where the weights live between uses: under ZeRO-3 (dist/zero3.h) each rank keeps 1/N of
// them and a unit is gathered for each use. The model brackets every use of a unit's weights
// with acquire/release (ParamUse): unit i is decoder layer i, kOuterUnit the token embedding, the
// final norm and the LM head. Uses nest (the residency counts them); in backward the residency
// holds a unit itself while the unit's nodes run.
class ParamResidency {
 public:
  static constexpr int64_t kOuterUnit = -1;
  // The unit of a parameter from its Hugging Face name ("model.layers.<i>." is unit i).
  static int64_t unit_of(const std::string& name);
  virtual ~ParamResidency() = default;
  virtual void acquire(int64_t unit) = 0;
  virtual void release(int64_t unit) = 0;
};
class ParamUse {
 public:
  ParamUse(ParamResidency* r, int64_t unit) : r_(r), unit_(unit) {
    if (r_) r_->acquire(unit_);
  }
  ~ParamUse() {
    if (r_) r_->release(unit_);
  }
  ParamUse(const ParamUse&) = delete;
  ParamUse& operator=(const ParamUse&) = delete;

 private:
  ParamResidency* r_;
  int64_t unit_;
};

struct ForwardResult {
  Tensor loss;    // [] f32
  Tensor logits;  // [T, V] when asked
  int64_t label_tokens = 0;
  // row_stats: the sums over the label rows of their entropy and of top-1 hits
  // (kernels::LinearCrossEntropyStats); unset where the loss path cannot give them.
  std::optional<kernels::LinearCrossEntropyStats> row_stats;
};

class DecoderModel {
 public:
  // Allocates every parameter (uninitialised) on `device` in `dtype`. Without
  // allocate_linear_weights the projections' dense weights are left undefined, for a caller
  // that gives every module a quantized `base` (loading a quantized model never holds the
  // whole dense model).
  DecoderModel(ModelConfig cfg, Device device, DType dtype, bool allocate_linear_weights = true);

  // Loads an HF causal-LM folder (single or sharded safetensors; f32/bf16/f16 on disk converted
  // to `dtype`; a *ForSequenceClassification folder is an Error: models/score_head.h loads those).
  // Missing tensors and tensors the model does not use are an Error naming them
  // (check_unexpected_tensors); known leftovers are listed in unused_tensors().
  static std::unique_ptr<DecoderModel> load(const std::string& dir, Device device, DType dtype);
  // Normal(0, initializer_range) for projections and embeddings, ones for norms, zeros for
  // biases, from the Philox stream (seed, kInit): the same model on every machine.
  void init_random(uint64_t seed);
  // Copies every parameter from `store`. A parameter named in `optional` may be absent (it keeps
  // its values; the names skipped so are returned); any other missing one is an Error.
  std::vector<std::string> load_weights(const TensorStore& store,
                                        const std::unordered_set<std::string>& optional = {});
  // Writes config.json + model.safetensors (sharded when max_shard_bytes > 0) in disk_dtype.
  // Under a residency (ZeRO-3) the weights are gathered one unit at a time and copied to the
  // host, so no rank holds the whole model on its device; it is then collective: every other
  // rank calls take_part_in_save() meanwhile.
  void save(const std::string& dir, DType disk_dtype, uint64_t max_shard_bytes = 0) const;
  // The gathers of a save() on another rank, with nothing kept.
  void take_part_in_save() const { (void)host_tensors(dtype_, false); }

  const ModelConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  DecoderLayer& layer(int64_t i) { return layers_[i]; }
  const DecoderLayer& layer(int64_t i) const { return layers_[i]; }
  Tensor embed_tokens() const { return embed_tokens_; }
  Tensor final_norm() const { return norm_; }
  // The LM head matrix [V, H] (the embedding when tied).
  Tensor lm_head_weight() const {
    LT_CHECK_INPUT(!score_.defined(), cfg_.architecture,
                   " is a sequence classifier (a reward model) without an LM head");
    if (!tied()) return lm_head_.weight;
    return embedding_override.matrix ? embedding_override.matrix(embed_tokens_) : embed_tokens_;
  }
  bool tied() const { return cfg_.tie_word_embeddings; }
  // *ForSequenceClassification (config.sequence_classification): the head `score.weight`
  // [num_labels, H], no bias; there is no LM head (models/score_head.h reads the scores).
  Tensor score_weight() const { return score_; }
  // What the score is read after (transformers reads config.pad_token_id); TRL's RewardTrainer
  // sets it to the tokenizer's pad token, and save() writes it.
  void set_pad_token_id(std::optional<int64_t> id) { cfg_.pad_token_id = id; }
  const std::vector<std::string>& unused_tensors() const { return unused_; }

  // Every dense parameter with its HF name, in a fixed order (the tied head is not listed
  // twice; the weight of a module whose `base` is quantized is not a parameter).
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  // Every weight in disk_dtype on the host (quantized ones dequantized), each unit acquired
  // while its tensors are copied; keep false: the acquisitions only.
  std::vector<std::pair<std::string, Tensor>> host_tensors(DType disk_dtype, bool keep) const;
  std::vector<LinearModule*> linear_modules();
  void set_requires_grad(bool on);
  // Parameters of the model as defined by its config, quantized weights included.
  int64_t num_parameters() const;

  ForwardResult forward(const Batch& batch, const ForwardOptions& opt = {});

  // Sequence tiling of the layers in training forwards (layer_forward; models/sequence_tiling.h).
  // Off by default; generation (layer_forward_with) never tiles.
  void set_sequence_tiling(const SequenceTiling& t) { tiling_ = t; }
  const SequenceTiling& sequence_tiling() const { return tiling_; }
  // The longest forward (rows) that ran tiled so far, and its block: the memory report's figure.
  int64_t largest_tiled_rows() const { return largest_tiled_rows_; }
  int64_t largest_tiled_chunk() const { return largest_tiled_chunk_; }

  // ZeRO-3's residency (not owned; nullptr: every weight is always resident).
  void set_param_residency(ParamResidency* r) { residency_ = r; }
  ParamResidency* param_residency() const { return residency_; }

  // Pieces used by forward, the trainers and generation. With a sink, a token embedding that
  // trains (untied, no embedding override) hands its gradient out by rows in backward.
  Tensor embed(const Tensor& ids, const RowGradSink& sink = nullptr) const;
  // One decoder layer over a flat varlen batch. positions:[T] i64, cu_seqlens:[B+1] i32 on the
  // model's device. With `cp`, attention is the zigzag ring over cp->comm (cu_seqlens unused).
  // Tiled in blocks of rows when sequence_tiling() says so for T rows.
  Tensor layer_forward(int64_t i, const Tensor& h, const Tensor& positions,
                       const Tensor& cu_seqlens, SeqHints seqs,
                       const ContextParallel* cp = nullptr) const;
  // One decoder layer with the attention step supplied by the caller (generation's KV cache).
  Tensor layer_forward_with(int64_t i, const Tensor& h, const LayerAttention& attend) const;
  // The family's RMSNorm: w * round(x rstd), or round(x rstd (1 + w)) with norm_unit_offset.
  Tensor norm(const Tensor& x, const Tensor& w) const;
  // The final norm over [T, H] hidden states (what the LM head reads).
  Tensor final_norm_forward(const Tensor& h) const;
  // Layer i's rope over x [T, N, D] at `positions`; longrope uses its long factors when
  // max_position + 1 exceeds original_max_position_embeddings (max_position < 0: read from
  // positions).
  Tensor apply_rope(int64_t layer, const Tensor& x, const Tensor& positions,
                    int64_t max_position = -1) const;
  // Layer i's attention options: causal, scale, sliding window and soft-cap.
  kernels::AttentionOptions attention_options(int64_t layer) const;
  // Embedding -> all layers -> final norm.
  Tensor hidden_states(const Tensor& ids, const Tensor& positions, const Tensor& cu_seqlens,
                       SeqHints seqs, bool gradient_checkpointing,
                       const RowGradSink& sink = nullptr,
                       std::shared_ptr<const ContextParallel> cp = nullptr) const;
  // Normed hidden states [T, H] -> logits [T, V] (soft-capped with final_logit_softcapping).
  Tensor logits(const Tensor& hidden) const;
  // final_logit_softcapping, or 0: what the fused losses apply to the head's logits.
  double logit_softcap() const { return cfg_.final_logit_softcapping; }

 private:
  ModelConfig cfg_;
  Device device_;
  DType dtype_;
  Tensor embed_tokens_;
  std::vector<DecoderLayer> layers_;
  Tensor norm_;
  LinearModule lm_head_;
  Tensor score_;  // sequence classification only
  ParamResidency* residency_ = nullptr;
  std::vector<std::string> unused_;
  SequenceTiling tiling_;
  // Statistics only (layer_forward is const): written by the training forward's thread.
  mutable int64_t largest_tiled_rows_ = 0, largest_tiled_chunk_ = 0;

  // Parts of layer i, shared by the plain, tiled and generation paths: q, k, v [T, N, D] before
  // rope (norm, projections, q/k norms); h1 = h + o_proj(attn) (normed with sandwich_norms) with
  // the MLP's input norm of h1, as one add_rms_norm; h1 + mlp(that norm).
  std::vector<Tensor> attention_inputs(int64_t i, const Tensor& h) const;
  kernels::AddRmsNormOutput attention_residual(int64_t i, const Tensor& h,
                                               const Tensor& attn) const;
  Tensor mlp_residual(int64_t i, const kernels::AddRmsNormOutput& h1) const;

 public:
  // Trainable tokens (models/trainable_tokens.h) set these so that a few embedding rows train
  // while embed_tokens stays frozen: embed() then calls `embed` and the tied head uses
  // `matrix` (embed_tokens with those rows replaced). Empty functions: the plain embedding.
  struct EmbeddingOverride {
    std::function<Tensor(const Tensor& weight, const Tensor& ids)> embed;
    std::function<Tensor(const Tensor& weight)> matrix;
  };
  EmbeddingOverride embedding_override;
};

// Error(kInput) naming dir when cfg is a sequence classifier where a causal LM is needed.
void check_causal_lm(const ModelConfig& cfg, const std::string& dir);

// The tensors of `store` that no parameter took (`used`). Known leftovers (a tied model's
// lm_head.weight, rotary inv_freq buffers) are returned; any other is an Error(kInput) naming the
// folder, a few of the tensors and why (layers beyond num_hidden_layers, or names this
// architecture does not have): silently dropping weights would change the model.
std::vector<std::string> check_unexpected_tensors(const TensorStore& store,
                                                  const std::unordered_set<std::string>& used,
                                                  const ModelConfig& cfg);

}  // namespace leantune
