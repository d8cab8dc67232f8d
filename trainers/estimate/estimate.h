// Memory estimate: the peak device memory of a training run, by category, predicted from the
// model's shape and the training options before anything is allocated (trainer_bin estimate),
// and printed beside the measured peak in the end-of-run memory report.
//
// The model mirrors what leantune's ops keep, not a generic rule of thumb:
//   params      dense weights in the compute dtype; NF4 weights at n/2 + absmax (4 B per 64,
//               or 1 B per 64 + 4 B per 16384 with double quantization); int8 at n + 4 B/row;
//               LoRA A/B and trainable-token deltas.
//   grads       one per trainable parameter in its dtype; the LM head's gradient from the fused
//               loss in f32.
//   optimizer   on the device, by --optim: adamw_torch two f32 moments per trainable parameter
//               plus an f32 master of 16-bit ones; adamw_8bit 2 B + 8 B per 256 (no master);
//               adafactor 4 B per row and column of each matrix, 4 B per vector element; sgd an
//               f32 master of 16-bit ones; paged_adamw_8bit / paged_adamw_32bit (2 B / 8 B)
//               on the host (optimizer_host). --offload_optimizer cpu: none on the device, the
//               states and an f32 master of every parameter on the host (optimizer_host).
//               --optimizer_in_backward: no full-model gradients; the largest gradient in
//               flight (plus the LM head's part of a tied embedding's) stands for grads.
//   activations what backward needs, per decoder layer: the inputs of both norms, q/k/v/out of
//               attention and its f32 log-sum-exp, gate and up of swiglu, and the input of
//               every projection whose weight trains or that carries a LoRA adapter (a frozen
//               projection keeps nothing but its weight); with gradient checkpointing only each
//               layer's input, plus one layer's set while it is recomputed; with activation
//               offloading nothing but what stays by rule (the last layer's output, which the
//               final norm saves outside offloading) plus the two layers being restored in
//               backward, and on CUDA up to five device->host copies in flight in forward.
//   loss        the fused linear cross-entropy holds dhidden and (when the head trains) the
//               head's gradient from forward to backward, and a chunk of logits as workspace;
//               with row_block_updates no head gradient is held, only one block of it (about
//               32 MiB of f32) with the [chunk x block] logits and dhidden in f32 as workspace
//               (and the embedding's gradient is one block at a time in backward);
//               the unfused path holds [tokens x vocab] logits and their gradient.
//   workspace   backward temporaries of one layer, f32 conversion buffers of 16-bit GEMMs on the
//               CPU, attention score blocks.
//   context     with cp_size C > 1 (context parallelism, dist/context_parallel.h) every
//   parallel    sequence is padded to a multiple of 2C and each rank holds 1/C of its rows: the
//               activations, the loss and the layer workspaces are those of the rank's tokens;
//               attention adds the zigzag ring's buffers: two KV buffers (k and v of the rank's
//               rows, double-buffered) in forward and beside them, in backward, the two dK/dV
//               buffers of the second ring and one block's dQ/dK/dV.
//   per rank    with world_size N > 1: ZeRO 1 and 2 keep 1/N of the optimizer states (and of
//               AdamW's f32 masters); ZeRO 2 keeps 1/N of each unit's gradients once backward
//               has completed it (the walk's layer gradients count 1/N); the reduction of a unit
//               of reduce_bucket_size elements needs its flat copy as comm workspace (three
//               copies under the rank-order fold: padded input, received blocks, gathered).
//               ZeRO 3 keeps 1/N of every parameter above stage3_param_persistence_threshold
//               elements (the smaller ones whole), plus the outer unit (embedding, final norm,
//               head) gathered for the whole step and one decoder layer gathered at each
//               moment of forward and backward.
// The peak is found by walking one optimizer step as the trainer runs it: forward layer by layer
// (each layer leaving what it keeps), the fused loss (which computes the head's gradient in
// forward), backward last layer first (each layer's gradients appearing as what it kept goes,
// the layer recomputed under checkpointing, two layers back from the host under offloading),
// the embedding's gradient (summed with the head's when tied), and the first optimizer step,
// which creates AdamW's state while every gradient is live. The phase names match the ones
// the trainer records at the allocator's peak.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loaders/model_config.h"
#include "loaders/option_table.h"
#include "models/sequence_tiling.h"

namespace leantune {

struct EstimateConfig {
  ModelConfig model;
  DType dtype = DType::kF32;
  bool cpu = true;                 // 16-bit GEMMs on the CPU convert operands to f32
  int64_t micro_batch_tokens = 0;  // tokens of the largest micro-batch (all cp ranks together)
  int64_t max_seqlen = 0;          // longest sequence in it
  int64_t attention_seqlen = 0;    // longest sequence attention runs over (packed rows hold
                                   // several); 0: max_seqlen
  int64_t gradient_accumulation_steps = 1;
  bool gradient_checkpointing = false;
  SequenceTiling tiling{TilingMode::kAuto, 0};  // --tiled_mlp, --tiled_mlp_chunk_size
  bool activation_offloading = false;
  int64_t min_offload_size = 1024;
  bool fused_loss = true;
  int64_t loss_chunk_tokens = 1024;
  // PEFT
  bool use_peft = false;
  int64_t lora_r = 16;
  std::vector<std::string> lora_target_modules;  // empty: q_proj, v_proj
  std::vector<std::string> lora_modules_to_save;
  int64_t trainable_tokens = 0;
  // Quantized base
  bool load_in_4bit = false;
  bool load_in_8bit = false;
  bool double_quant = true;
  // Optimizer (trainers/common/optim_options.h)
  std::string optim = "adamw_torch";
  bool optimizer_in_backward = false;
  bool offload_optimizer = false;
  // sft under optimizer_in_backward with an optim that takes row blocks: an untied LM head (in
  // the fused loss) and token embedding that train are updated block by block, so neither's
  // whole gradient exists.
  bool row_block_updates = false;
  // Distribution (dist/dist_options.h): ranks, ZeRO stage (0..3), elements per unit
  int64_t world_size = 1;
  int64_t zero_stage = 0;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t reduce_bucket_size = 25'000'000;
  bool deterministic_comm = false;
  int64_t cp_size = 1;  // context-parallel ranks per micro-batch (world_size is a multiple)
  // Outside the allocator (host resident memory)
  int64_t resident_before_training = 0;  // code, libraries, tokenizer and data (bytes)
  int64_t blas_threads = 1;
};

struct MemoryEstimate {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;       // on the device
  int64_t optimizer_host = 0;  // --offload_optimizer cpu
  int64_t activations = 0;     // saved for backward at the end of forward
  int64_t loss = 0;            // held by the loss between forward and backward
  int64_t workspace = 0;       // transient at the peak
  int64_t peak = 0;
  std::string peak_phase;   // "forward", "loss", "backward", "optimizer step" (as the trainer
                            // names its phases in the memory report)
  std::string peak_detail;  // where inside it: "layer 3", "embedding", ...
  int64_t trainable_parameters = 0;
  int64_t total_parameters = 0;
  // Host resident memory (RSS). On the CPU the allocator's segments are part of it: the peak
  // plus the caching allocator's unused cached blocks, which the CPU runs measured at 5-19% of
  // the peak (counted as 12% in f32 runs, none in 16-bit ones, as measured). Outside the allocator:
  // what was resident before training, BLAS buffers (OpenBLAS's per-thread buffer, about 31 MiB per
  // thread resident once weight gradients are computed, about 3 MiB when only input gradients are,
  // as measured), and the host pool that activation offloading fills. On CUDA: what was resident
  // before training, the pinned pool of offloaded activations and the optimizer states on the host;
  // at least the loading peak (loading_rss).
  int64_t outside_allocator = 0;
  int64_t blas_buffers = 0;
  int64_t offloaded_host = 0;
  // CUDA runs: the host's peak while the streaming loader copies weights to the device (what
  // was resident before plus the largest weight's dense host copy); rss_peak is at least this.
  int64_t loading_rss = 0;
  int64_t rss_peak = 0;
  int64_t tiling_chunk = 0;  // rows per block of the tiled layers; 0: untiled
  nlohmann::json to_json() const;
};

MemoryEstimate estimate_memory(const EstimateConfig& cfg);

// Tokens one rank holds of a micro-batch under cp_size (each sequence of max_seqlen padded to a
// multiple of 2 cp_size, 1/cp_size of its rows per rank); micro_batch_tokens when cp_size is 1.
int64_t rank_tokens(const EstimateConfig& cfg);

}  // namespace leantune

namespace leantune {

struct TrainingArguments;
struct PeftConfig;
struct QuantConfig;
class Options;

// The estimate inputs of an sft run, from the typed arguments the trainer itself uses: the
// training arguments (batch size, accumulation, bf16, checkpointing, offloading), the PEFT
// config (null: full training), the quantization config, whether the loss is fused, and
// max_length (0: none). Micro-batch tokens = per_device_train_batch_size x max_length (the
// model's max_position_embeddings without one) unless given.
EstimateConfig estimate_config(const ModelConfig& model, const TrainingArguments& args,
                               const PeftConfig* peft, const QuantConfig& quant, bool fused_loss,
                               int64_t max_length, bool cpu, int64_t micro_batch_tokens = 0,
                               int64_t max_seqlen = 0);
// The same from a parsed set of sft options, read through those arguments' own readers.
EstimateConfig estimate_config_from_options(const Options& o, const ModelConfig& model, bool cpu);

// The front of every `trainer_bin estimate` variant: parses `args` into `o` (nullopt: --help was
// printed), then the model to plan for: --model_name_or_path, or the demo's config.json.
struct EstimateTarget {
  std::string path;  // the model folder or config.json read
  ModelConfig model;
  Device device;
};
std::optional<EstimateTarget> parse_estimate_target(Options& o,
                                                    const std::vector<std::string>& args);
// `estimate`'s --world_size (the ranks whose per-rank peak is predicted), for every trainer's
// estimate.
struct EstimateRanks {
  int64_t world_size = 1;
};
const OptionTable<EstimateRanks>& world_size_table();

}  // namespace leantune
