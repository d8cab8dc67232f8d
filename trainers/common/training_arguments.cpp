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
#include "trainers/common/schedule.h"
#include "trainers/common/trainer.h"

namespace leantune {

namespace {

const OptionTable<SequenceTiling>& tiling_table() {
  using T = SequenceTiling;
  static const OptionTable<T> t =
      OptionTable<T>()
          .choice(
              "tiled_mlp", &T::mode,
              "sequence tiling: each decoder layer's norms, projections, rope, MLP and "
              "residual adds run in blocks of tiled_mlp_chunk_size tokens, so no [tokens x "
              "intermediate] buffer exists (auto: for forwards over " +
                  std::to_string(kTilingAutoMinTokens) + " tokens)",
              {{"auto", TilingMode::kAuto}, {"true", TilingMode::kOn}, {"false", TilingMode::kOff}})
          .integer("tiled_mlp_chunk_size", &T::chunk_tokens,
                   "tokens per block of tiled_mlp (0 = max(hidden_size, 1024): each block's MLP "
                   "intermediates no larger than one MLP weight)",
                   0);
  return t;
}

}  // namespace

const OptionTable<TrainingArguments>& training_table() {
  using A = TrainingArguments;
  static const OptionTable<A> t =
      OptionTable<A>()
          .text("output_dir", &A::output_dir,
                "where checkpoints, metrics.jsonl and the final model go")
          .integer("per_device_train_batch_size", &A::per_device_train_batch_size,
                   "examples (or packed sequences) per micro-batch", 1)
          .integer("gradient_accumulation_steps", &A::gradient_accumulation_steps,
                   "micro-batches per optimizer update", 1)
          .real("learning_rate", &A::learning_rate, "peak learning rate of AdamW", 0.0)
          .text("lr_scheduler_type", &A::lr_scheduler_type,
                "learning-rate schedule (transformers' get_scheduler; constant has no warmup)",
                lr_schedule_names())
          .text("lr_scheduler_kwargs", &A::lr_scheduler_kwargs,
                "JSON object of the schedule's parameters, e.g. '{\"num_cycles\": 1}', "
                "'{\"min_lr_rate\": 0.1}' (cosine_with_min_lr), '{\"num_decay_steps\": 100}' "
                "(warmup_stable_decay)")
          .real("warmup_steps", &A::warmup_steps,
                "linear warmup: a number of updates (>= 1, a fraction dropped) or, below 1, the "
                "ratio of all updates (transformers 5's warmup_steps)",
                0.0)
          .alias("warmup_ratio", "warmup_steps")
          .real("weight_decay", &A::weight_decay,
                "decoupled weight decay (not applied to biases and norm weights)", 0.0)
          // torch.optim.AdamW's ranges: a beta of 1 never forgets and divides by 1 - beta^t = 0.
          .real_below("adam_beta1", &A::adam_beta1, "beta1 of every AdamW variant, in [0, 1)", 0.0,
                      1.0)
          .real_below("adam_beta2", &A::adam_beta2, "beta2 of every AdamW variant, in [0, 1)", 0.0,
                      1.0)
          .real("adam_epsilon", &A::adam_epsilon, "AdamW epsilon", 0.0)
          .base(optim_table())
          .real("max_grad_norm", &A::max_grad_norm,
                "clip the global gradient norm to this (0 = off)", 0.0)
          .integer("max_consecutive_nonfinite", &A::max_consecutive_nonfinite,
                   "updates skipped in a row for a non-finite loss, gradient or (online "
                   "trainers) reward before the run stops with exit 4; each is a warning and "
                   "counted",
                   1)
          .real("num_train_epochs", &A::num_train_epochs, "epochs over the training data", 0.0)
          .integer("max_steps", &A::max_steps, "total updates; overrides num_train_epochs when > 0")
          .real("logging_steps", &A::logging_steps,
                "log every this many updates (below 1: a ratio of all updates)", 0.0)
          .flag("logging_first_step", &A::logging_first_step,
                "also log the first update (whatever logging_steps)")
          .base(eval_table())
          .real("save_steps", &A::save_steps,
                "checkpoint every this many updates (below 1: a ratio of all updates; 0 = never)",
                0.0)
          .text("save_strategy", &A::save_strategy,
                "when checkpoints are written: every save_steps updates (steps), at the end of "
                "every epoch (epoch), or never (no; a stop signal still saves one)",
                {"steps", "epoch", "no"})
          .flag("save_only_model", &A::save_only_model,
                "checkpoints hold the model without the optimizer state: smaller, but no run can "
                "resume from them, as in transformers (a stop signal's checkpoint stays whole)")
          .integer("save_total_limit", &A::save_total_limit,
                   "keep at most this many checkpoints (0 = all)", 0)
          .integer("seed", &A::seed, "seed of data order, init and dropout", 0)
          .flag("bf16", &A::bf16,
                "bf16 weights and activations, f32 master weights and optimizer state")
          .flag("gradient_checkpointing", &A::gradient_checkpointing,
                "recompute each decoder layer in backward, keeping only its input")
          .nested(&A::tiling, tiling_table())
          .base(offload_table())
          .base(dist_table())
          .text("device", &A::device, "cpu, cuda, cuda:N or auto (cuda when a GPU is present)")
          .real("max_memory_gib", &A::max_memory_gib,
                "cap of the CPU backend's allocator in GiB, refused with exit 3 beyond it (0 = "
                "80% of what an address-space limit, ulimit -v, leaves; none without one)",
                0.0)
          .text("resume_from_checkpoint", &A::resume_from_checkpoint,
                "a checkpoint folder, or 'latest' for the newest complete one in output_dir")
          .text("memory_trace", &A::memory_trace,
                "write the allocator trace (alloc/free/segment events with tag, size, stream, "
                "time and phase) of the first memory_trace_steps updates to this JSON file; "
                "view it with trainer_bin memviz")
          .integer("memory_trace_steps", &A::memory_trace_steps, "updates recorded by memory_trace",
                   1)
          .integer("profile_steps", &A::profile_steps,
                   "print the time per op kind of this many updates (2..N+1) and write "
                   "output_dir/profile.json (0 = off)",
                   0)
          .list("report_to", &A::report_to,
                "where the logs also go (transformers' option): none, tensorboard (event files "
                "in $TENSORBOARD_LOGGING_DIR, else output_dir/runs/<time>_<host>) or all");
  return t;
}

void add_training_options(Options& o) { training_table().declare(o); }

TrainingArguments training_arguments(const Options& o) {
  TrainingArguments a = training_table().read(o);
  check_steps("logging_steps", a.logging_steps);
  check_steps("save_steps", a.save_steps);
  LT_CHECK_INPUT(a.logging_steps > 0, "option --logging_steps: must be above 0");
  static_cast<EvalArguments&>(a) =
      eval_arguments(o, a.save_strategy, a.save_steps, a.logging_steps);
  LT_CHECK_INPUT(a.lr_scheduler_type != "reduce_lr_on_plateau" || a.eval_strategy != "no",
                 "option --lr_scheduler_type reduce_lr_on_plateau needs --eval_strategy steps or "
                 "epoch: it lowers the rate on the evaluations' metric_for_best_model");
  check_optim_arguments(a, a.gradient_accumulation_steps, a.max_grad_norm);
  LT_CHECK_INPUT(a.save_strategy == "steps" || !o.is_set("save_steps") || a.save_steps == 0,
                 "option --save_steps ", a.save_steps, " is for save_strategy steps, not ",
                 a.save_strategy);
  // The schedule's parameters are checked before anything loads (the step counts come later).
  (void)LrScheduler::make(a.lr_scheduler_type, a.learning_rate, 1000, 0, 0.0,
                          parse_lr_scheduler_kwargs(a.lr_scheduler_kwargs));
  check_dist_arguments(a);
  for (const std::string& r : a.report_to)
    LT_CHECK_INPUT(r == "none" || r == "tensorboard" || r == "all", "option --report_to: '", r,
                   "' is not supported (supported: none, tensorboard, all)");
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

bool reports_to_tensorboard(const TrainingArguments& a) {
  for (const std::string& r : a.report_to)
    if (r == "tensorboard" || r == "all") return true;
  return false;
}

}  // namespace leantune
