// The options every trainer shares (transformers' TrainingArguments and TRL's names and
// defaults) and their reading into TrainingArguments, with the checks that need no model.
#include <string>
#include <vector>

#include "dist/dist_options.h"
#include "engine/check.h"
#include "engine/gemm_tuning.h"
#include "loaders/fs_util.h"
#include "trainers/common/offload_options.h"
#include "trainers/common/optim_options.h"
#include "trainers/common/output_path.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/trainer.h"

namespace leantune {

void add_training_options(Options& o) {
  TrainingArguments d;
  o.add_string("output_dir", d.output_dir,
               "where checkpoints, metrics.jsonl and the final model go");
  o.add_int("per_device_train_batch_size", d.per_device_train_batch_size,
            "examples (or packed sequences) per micro-batch", 1);
  o.add_int("per_device_eval_batch_size", d.per_device_eval_batch_size,
            "examples per evaluation batch", 1);
  o.add_int("gradient_accumulation_steps", d.gradient_accumulation_steps,
            "micro-batches per optimizer update", 1);
  o.add_float("learning_rate", d.learning_rate, "peak learning rate of AdamW", 0.0);
  o.add_string("lr_scheduler_type", d.lr_scheduler_type, "learning-rate schedule after warmup",
               {"linear", "cosine", "constant", "constant_with_warmup"});
  o.add_float("warmup_ratio", d.warmup_ratio, "fraction of updates used for linear warmup", 0.0,
              1.0);
  o.add_int("warmup_steps", d.warmup_steps, "updates of linear warmup (overrides warmup_ratio)", 0);
  o.add_float("weight_decay", d.weight_decay,
              "decoupled weight decay (not applied to biases and norm weights)", 0.0);
  // torch.optim.AdamW's ranges: a beta of 1 never forgets and divides by 1 - beta^t = 0.
  o.add_float_below("adam_beta1", d.adam_beta1, "beta1 of every AdamW variant, in [0, 1)", 0.0,
                    1.0);
  o.add_float_below("adam_beta2", d.adam_beta2, "beta2 of every AdamW variant, in [0, 1)", 0.0,
                    1.0);
  o.add_float("adam_epsilon", d.adam_epsilon, "AdamW epsilon", 0.0);
  add_optim_options(o);
  o.add_float("max_grad_norm", d.max_grad_norm, "clip the global gradient norm to this (0 = off)",
              0.0);
  o.add_int("max_consecutive_nonfinite", d.max_consecutive_nonfinite,
            "updates skipped in a row for a non-finite loss, gradient or (online trainers) reward "
            "before the run stops with exit 4; each is a warning and counted",
            1);
  o.add_float("num_train_epochs", d.num_train_epochs, "epochs over the training data", 0.0);
  o.add_int("max_steps", d.max_steps, "total updates; overrides num_train_epochs when > 0");
  o.add_int("logging_steps", d.logging_steps, "log every this many updates", 1);
  o.add_int("eval_steps", d.eval_steps, "evaluate every this many updates (0 = only at the end)",
            0);
  o.add_int("save_steps", d.save_steps, "checkpoint every this many updates (0 = never)", 0);
  o.add_int("save_total_limit", d.save_total_limit, "keep at most this many checkpoints (0 = all)",
            0);
  o.add_int("seed", static_cast<int64_t>(d.seed), "seed of data order, init and dropout", 0);
  o.add_bool("bf16", d.bf16,
             "bf16 weights and activations, f32 master weights and optimizer state");
  o.add_bool("gradient_checkpointing", d.gradient_checkpointing,
             "recompute each decoder layer in backward, keeping only its input");
  o.add_string("tiled_mlp", tiling_mode_name(d.tiling.mode),
               "sequence tiling: each decoder layer's norms, projections, rope, MLP and residual "
               "adds run in blocks of tiled_mlp_chunk_size tokens, so no [tokens x intermediate] "
               "buffer exists (auto: for forwards over " +
                   std::to_string(kTilingAutoMinTokens) + " tokens)",
               {"auto", "true", "false"});
  o.add_int("tiled_mlp_chunk_size", d.tiling.chunk_tokens,
            "tokens per block of tiled_mlp (0 = max(hidden_size, 1024): each block's MLP "
            "intermediates no larger than one MLP weight)",
            0);
  add_offload_options(o);
  add_dist_options(o);
  o.add_string("device", d.device, "cpu, cuda, cuda:N or auto (cuda when a GPU is present)");
  o.add_float("max_memory_gib", d.max_memory_gib,
              "cap of the CPU backend's allocator in GiB, refused with exit 3 beyond it (0 = 80% "
              "of what an address-space limit, ulimit -v, leaves; none without one)",
              0.0);
  o.add_string("resume_from_checkpoint", "",
               "a checkpoint folder, or 'latest' for the newest complete one in output_dir");
  o.add_string("memory_trace", d.memory_trace,
               "write the allocator trace (alloc/free/segment events with tag, size, stream, "
               "time and phase) of the first memory_trace_steps updates to this JSON file; "
               "view it with trainer_bin memviz");
  o.add_int("memory_trace_steps", d.memory_trace_steps, "updates recorded by memory_trace", 1);
  o.add_int("profile_steps", d.profile_steps,
            "print the time per op kind of this many updates (2..N+1) and write "
            "output_dir/profile.json (0 = off)",
            0);
}

TrainingArguments training_arguments(const Options& o) {
  TrainingArguments a;
  a.output_dir = o.get_string("output_dir");
  a.per_device_train_batch_size = o.get_int("per_device_train_batch_size");
  a.per_device_eval_batch_size = o.get_int("per_device_eval_batch_size");
  a.gradient_accumulation_steps = o.get_int("gradient_accumulation_steps");
  a.learning_rate = o.get_float("learning_rate");
  a.lr_scheduler_type = o.get_string("lr_scheduler_type");
  a.warmup_ratio = o.get_float("warmup_ratio");
  a.warmup_steps = o.get_int("warmup_steps");
  a.weight_decay = o.get_float("weight_decay");
  a.adam_beta1 = o.get_float("adam_beta1");
  a.adam_beta2 = o.get_float("adam_beta2");
  a.adam_epsilon = o.get_float("adam_epsilon");
  const OptimArguments optim = optim_arguments(o);
  a.optim = optim.optim;
  a.optimizer_in_backward = optim.optimizer_in_backward;
  a.offload_optimizer = optim.offload_optimizer;
  a.max_grad_norm = o.get_float("max_grad_norm");
  a.max_consecutive_nonfinite = o.get_int("max_consecutive_nonfinite");
  a.num_train_epochs = o.get_float("num_train_epochs");
  a.max_steps = o.get_int("max_steps");
  a.logging_steps = o.get_int("logging_steps");
  a.eval_steps = o.get_int("eval_steps");
  a.save_steps = o.get_int("save_steps");
  a.save_total_limit = o.get_int("save_total_limit");
  a.seed = static_cast<uint64_t>(o.get_int("seed"));
  a.bf16 = o.get_bool("bf16");
  a.gradient_checkpointing = o.get_bool("gradient_checkpointing");
  a.tiling.mode = parse_tiling_mode(o.get_string("tiled_mlp"), "tiled_mlp");
  a.tiling.chunk_tokens = o.get_int("tiled_mlp_chunk_size");
  const OffloadArguments off = offload_arguments(o);
  a.activation_offloading = off.activation_offloading;
  a.min_offload_size = off.min_offload_size;
  const DistArguments dist = dist_arguments(o);
  a.comm = dist.comm;
  a.zero_stage = dist.zero_stage;
  a.reduce_bucket_size = dist.reduce_bucket_size;
  a.stage3_param_persistence_threshold = dist.stage3_param_persistence_threshold;
  a.stage3_prefetch_bucket_size = dist.stage3_prefetch_bucket_size;
  a.cp_size = dist.cp_size;
  a.device = o.get_string("device");
  a.max_memory_gib = o.get_float("max_memory_gib");
  a.resume_from_checkpoint = o.get_string("resume_from_checkpoint");
  a.memory_trace = o.get_string("memory_trace");
  a.memory_trace_steps = o.get_int("memory_trace_steps");
  a.profile_steps = o.get_int("profile_steps");
  if (!a.memory_trace.empty()) {
    std::vector<CommandInput> inputs;
    for (const char* k : {"model_name_or_path", "dataset", "eval_dataset"})
      if (o.declared(k)) inputs.push_back({o.get_string(k), std::string("--") + k});
    check_output_file(a.memory_trace, "memory_trace", inputs);
  }
  LT_CHECK_INPUT(!a.output_dir.empty(), "option output_dir must not be empty");
  LT_CHECK_INPUT(a.max_steps > 0 || a.num_train_epochs > 0,
                 "options max_steps and num_train_epochs: one of them must be > 0");
  return a;
}

}  // namespace leantune
