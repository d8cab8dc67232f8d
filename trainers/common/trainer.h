// The training loop shared by every trainer (sft, dpo, kto, reward, and the online trainers grpo,
// rloo and online_dpo): each subclasses Trainer and supplies its data and loss through the hooks.
//
// One optimizer update ("step") = gradient_accumulation_steps micro-batches; as in transformers'
// Trainer an update never spans two epochs: an epoch is ceil(M / accumulation) updates of its M
// micro-batches, the last taking what remains (current_accumulation_steps). The loss of each
// micro-batch is normalised by the number of loss tokens across the WHOLE accumulated batch
// (not averaged per micro-batch), so 4 x 1 and 1 x 4 give the same gradients. Then:
// gradient norm -> non-finite check (a non-finite loss or gradient skips the update, names the
// step, is counted; 10 in a row stop the run with exit 4) -> clipping to max_grad_norm ->
// the optimizer (--optim; AdamW by default) with the scheduled learning rate. Logging every
// logging_steps (metrics.jsonl and the progress bar), evaluation every eval_steps, a checkpoint
// every save_steps (at most save_total_limit kept). A stop signal (trainers/common/stop_signal.h)
// is honoured between micro-batches and inside a generation phase: the update under way is
// abandoned (its gradients dropped), the state of the last completed update is saved as a
// checkpoint (none before the first update completes), and train() returns. At the end the final
// model is written to output_dir as an HF folder and a memory report is printed.
//
// Subclasses provide the data and the loss through the virtual hooks below.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dist/context_parallel.h"
#include "dist/dist_options.h"
#include "dist/zero3.h"
#include "engine/comm.h"
#include "engine/offload.h"
#include "engine/optim.h"
#include "loaders/batch.h"
#include "loaders/collate.h"
#include "loaders/examples.h"
#include "loaders/option_table.h"
#include "models/decoder.h"
#include "models/peft_io.h"
#include "models/quantize_model.h"
#include "trainers/common/evaluation.h"
#include "trainers/common/metrics.h"
#include "trainers/common/offload_options.h"
#include "trainers/common/optim_options.h"
#include "trainers/common/schedule.h"
#include "trainers/common/stop_signal.h"

namespace leantune {

class GradientBuckets;
class ZeroOptimizer;

// The options every trainer shares (training_table(): TRL/transformers names and defaults); the
// optimizer, activation-offloading, distribution and evaluation groups are its bases.
struct TrainingArguments : OptimArguments, OffloadArguments, DistArguments, EvalArguments {
  std::string output_dir = "trainer_output";
  int64_t per_device_train_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 2e-5;
  std::string lr_scheduler_type = "linear";
  std::string lr_scheduler_kwargs;  // a JSON object of the schedule's parameters (schedule.h)
  // transformers 5: >= 1 a number of updates (a fraction dropped), below 1 a ratio of the total.
  double warmup_steps = 0;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;
  // transformers' rule for the three step counts: >= 1 a number of updates (an integer), below
  // 1 a ratio of all updates (rounded up; resolve_steps).
  double logging_steps = 10;
  double save_steps = 500;
  std::string save_strategy = "steps";  // steps (every save_steps) | epoch | no
  bool save_only_model = false;         // checkpoints without optimizer state: no resume from them
  bool logging_first_step = false;
  int64_t save_total_limit = 0;
  uint64_t seed = 42;
  bool bf16 = false;
  bool gradient_checkpointing = false;
  // --tiled_mlp / --tiled_mlp_chunk_size (models/sequence_tiling.h): auto by default.
  SequenceTiling tiling{TilingMode::kAuto, 0};
  std::string device = "auto";
  std::string resume_from_checkpoint;
  int64_t max_consecutive_nonfinite = 10;
  double max_memory_gib = 0;  // CPU allocator cap (0 = derived from ulimit -v, if any)
  std::string memory_trace;   // allocator trace of the first memory_trace_steps updates (JSON)
  int64_t memory_trace_steps = 3;
  int64_t profile_steps =
      0;  // per-op step profile of this many updates (trainers/common/step_profile.h)
  // transformers' report_to: none, tensorboard (trainers/common/tfevents.h) or all (= every
  // integration leantune has: tensorboard).
  std::vector<std::string> report_to = {"none"};
};
// Whether report_to names tensorboard (or all).
bool reports_to_tensorboard(const TrainingArguments& a);

// Before a run loads anything: output_dir checked and created (trainers/common/output_path.h), and
// under ulimit -v OpenBLAS's buffers reserved and the CPU allocator capped (engine/host_memory.h),
// the plan printed on stderr.
void prepare_run(const TrainingArguments& args);

// A warning on stderr when max_length (0: none) is above the model's max_position_embeddings:
// positions past it were never trained (transformers' tokenizer warns of the same).
void warn_beyond_positions(int64_t max_length, const DecoderModel& model);

// The line a command prints when a signal stopped train() after `steps` completed updates.
std::string stopped_line(const std::string& command, int64_t steps);

// The micro-batches one update accumulates, for every trainer (Trainer::train): the option's
// gradient_accumulation_steps, unless one epoch has fewer micro-batches (per rank) than that:
// then each update takes the whole epoch's, as transformers' Trainer ends an update with the
// epoch (so num_train_epochs stays the number of passes over the data), with a warning on
// stderr naming both numbers.
int64_t accumulation_for_epoch(int64_t gradient_accumulation_steps, int64_t micro_batches_per_epoch,
                               bool warn);

const OptionTable<TrainingArguments>& training_table();
// Declares the options every trainer shares (training_table()).
void add_training_options(Options& o);
// training_table().read, with the checks that need no model.
TrainingArguments training_arguments(const Options& o);

struct TrainResult {
  int64_t steps = 0;
  std::vector<double> losses;  // per update
  bool interrupted = false;
  int64_t skipped_steps = 0;
  std::optional<double> final_eval_loss;  // the evaluation at the end (none without eval data)
  nlohmann::json final_eval;              // its whole record (eval_* metrics); null without one
  nlohmann::json memory;
  // Resumed from a checkpoint already at or past the run's last step: nothing was trained.
  bool nothing_to_do = false;
  std::string resumed_from;
  int64_t total_steps = 0;
};

class Trainer {
 public:
  Trainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options);
  virtual ~Trainer();

  TrainResult train();

  // Test hooks: updates (1-based) whose loss is made NaN before backward.
  void set_nan_injection(std::set<int64_t> steps) { nan_steps_ = std::move(steps); }
  // Stop (as on SIGTERM: checkpoint and return) after this update.
  void set_stop_after(int64_t step) { stop_after_ = step; }
  // Called after every update with {step, total_steps, loss, grad_norm, learning_rate,
  // num_tokens, skipped, allocated}; returning false stops as set_stop_after does.
  using StepCallback = std::function<bool(const nlohmann::json& record)>;
  void set_step_callback(StepCallback cb) { step_callback_ = std::move(cb); }
  // false: train() leaves the process's SIGTERM/SIGINT/SIGHUP handlers alone (an embedder that
  // handles signals itself stops the run with request_stop(), trainers/common/stop_signal.h).
  void set_install_signal_handlers(bool install) { install_signal_handlers_ = install; }
  // Test hooks: called before each micro-batch's forward (update 1-based, micro-batch 0-based),
  // and inside every checkpoint save with its temporary folder, after its files are written.
  void set_micro_batch_hook(std::function<void(int64_t update, size_t micro_batch)> hook) {
    micro_batch_hook_ = std::move(hook);
  }
  void set_save_hook(std::function<void(const std::string& dir)> hook) {
    save_hook_ = std::move(hook);
  }
  DecoderModel& model() { return *model_; }
  const TrainingArguments& args() const { return args_; }
  // The training data's report (rows read, dropped, truncated) and every logged record's
  // algorithm metrics in order (none for sft: its records hold loss and the shared fields only).
  virtual const DataStats& train_stats() const = 0;
  virtual const std::vector<nlohmann::json>& logged_metrics() const;
  // LoRA / trainable tokens (inactive for full fine-tuning): what the optimizer trains and what
  // saving writes (PEFT files). base_model_name_or_path goes into adapter_config.json;
  // merge_adapter also writes output_dir/merged at the end.
  void set_peft(PeftSetup peft, std::string base_model_name_or_path, bool merge_adapter);
  PeftSetup& peft() { return peft_; }
  // What quantizing the frozen base saved (QLoRA), for the memory report.
  void set_quantized_base(QuantConfig cfg, QuantizeReport report);
  // Context parallelism (--cp_size > 1 in `groups`, dist/context_parallel.h), for a trainer
  // whose supports_context_parallel() is true: its micro-batches are split over groups.cp; pads
  // added by the split take pad_token_id.
  void set_context_parallel(std::shared_ptr<ContextParallelGroups> groups, int64_t pad_token_id);
  // The communicator the run spans (an embedder's, public API); unset: the process's world
  // communicator (world_communicator(args.comm)).
  void set_communicator(std::shared_ptr<Communicator> comm) { comm_ = std::move(comm); }
  Communicator& comm() const;

 protected:
  bool context_parallel() const;
  // What the micro-batches are sharded over: the dp group under context parallelism (the ranks
  // of a cp group share theirs), else the world.
  Communicator& data_comm() const;
  // The ranks of a cp group hold one replicated loss per micro-batch: its counts (loss_tokens)
  // and value go into the world-wide sums on cp rank 0 only (true without context parallelism).
  bool counts_replicated_loss() const;
  std::shared_ptr<ContextParallelGroups> cp_groups_;
  std::shared_ptr<Communicator> comm_;
  int64_t cp_pad_token_id_ = 0;
  // Micro-batches per epoch of this rank (for num_train_epochs -> total steps).
  virtual int64_t micro_batches_per_epoch() const = 0;
  // The next micro-batch (the data side moves across epochs by itself).
  virtual Batch next_micro_batch(BatchReport* report) = 0;
  // Tokens the loss of this batch is normalised over when accumulated (label tokens for SFT).
  virtual int64_t loss_tokens(const Batch& b) const = 0;
  // Forward (and nothing else) of one micro-batch, loss divided by `normalizer`.
  virtual Tensor compute_loss(const Batch& b, double normalizer) = 0;
  // The loop dropped the last `count` fetched micro-batches without compute_loss (an update with
  // no loss token is skipped): a trainer that queues what next_micro_batch fetched drops them.
  virtual void discard_micro_batches(size_t count) {}
  // The metrics of the evaluation data with the current weights, without the eval_ prefix:
  // {"loss": mean loss, and the trainer's TRL metrics}; nullopt when there is no such data.
  virtual std::optional<nlohmann::json> evaluate() { return std::nullopt; }
  // An evaluation over `rows` examples in batches of per_device_eval_batch_size, reduced as
  // transformers' evaluation loop and TRL's metric lists reduce them: `batch` returns one batch's
  // mean loss and its metrics; "loss" is the example-weighted mean of the batch losses, every
  // other metric the mean over batches (MetricWindow: non-finite values left out). No gradients,
  // no adapter dropout, the allocator phase kEvaluation.
  using EvalBatch =
      std::function<std::pair<double, nlohmann::json>(const std::vector<int64_t>& rows)>;
  nlohmann::json evaluate_in_batches(int64_t rows, const EvalBatch& batch);
  // Whether evaluate() has data to evaluate (an eval_strategy needs it).
  virtual bool has_evaluation() const { return false; }
  // Whether per_device_eval_batch_size is used (evaluation, or dpo's and kto's precompute pass);
  // set but unused, it is a warning.
  virtual bool uses_eval_batch_size() const { return has_evaluation(); }
  // Set during compute_loss under optimizer_in_backward when the optimizer takes row blocks: a
  // trainer whose loss is the model's fused causal-LM loss passes it on (ForwardOptions), so the
  // LM head is updated inside the loss and its whole gradient never exists.
  const RowGradSink& row_grad_sink() const { return row_grad_sink_; }
  virtual double epoch_progress() const = 0;  // fractional epoch, for logs
  virtual nlohmann::json data_state() const = 0;
  // Positions the data side at `s` (a resume, or an update a stop abandoned: micro-batches
  // fetched and not yet through compute_loss are dropped).
  virtual void set_data_state(const nlohmann::json& s) = 0;
  // Extra files for the model folder (default: the tokenizer files of tokenizer_dir_).
  virtual void write_model_extras(const std::string& dir) const;
  // What the optimizer updates (default: the adapters under LoRA, else every model parameter
  // that requires grad).
  virtual std::vector<std::pair<std::string, Tensor>> trainable_parameters() const;
  // Writes the trained weights to dir (default: the adapter under LoRA, merged too at the end
  // with merge_adapter; else the model as an HF folder). `final_output` is true for the
  // end-of-training save into output_dir.
  virtual void save_model(const std::string& dir, bool final_output) const;
  // README.md in dir: the model card of the final model (trainers/common/model_card.h), with
  // the last logged metrics.
  void write_model_card(const std::string& dir, const nlohmann::json& last_logged) const;
  // Restores what save_model wrote into a checkpoint.
  virtual void load_model(const std::string& dir);
  // Called once before the loop, after resuming.
  virtual void on_train_begin(MetricsLogger& log) {}
  // Whether this trainer splits its micro-batches over --cp_size ranks (the specs with
  // context_parallel: sft, dpo and kto; the others refuse cp_size > 1).
  virtual bool supports_context_parallel() const { return false; }
  // Memory-report lines a trainer adds (what its techniques saved).
  virtual nlohmann::json technique_savings() const { return nlohmann::json::object(); }
  // The chunked loss's line for technique_savings: the f32 [tokens x vocab] logits and their
  // gradient of the largest micro-batch (`tokens`) that never existed.
  nlohmann::json chunked_loss_saving(int64_t tokens) const;
  // A line on stderr that keeps the progress bar intact (through the run's MetricsLogger while
  // train() runs).
  void warn(const std::string& text) const;
  // Trainer-specific metrics of the logging window (DPO's rewards/*), merged into each logged
  // record; the trainer resets its window when called.
  virtual nlohmann::json log_metrics() { return nlohmann::json::object(); }

  std::shared_ptr<DecoderModel> model_;
  TrainingArguments args_;
  Options options_;
  // Host resident memory outside the allocators when the loop began (bytes).
  int64_t resident_before_training_ = 0;
  PeftSetup peft_;
  std::string base_model_name_or_path_;
  bool merge_adapter_ = false;
  QuantConfig quant_config_;  // load_in_4bit / load_in_8bit off: a dense base
  QuantizeReport quant_report_;
  std::string tokenizer_dir_;  // copied into every saved model folder ("" = none)
  // ZeRO-3's parameter residency (null below stage 3 or on one rank); made by train().
  Zero3Params* zero3() const { return zero3_.get(); }
  // ZeRO-3 and a save of save_model(): the residency when every rank must gather every unit for
  // it (a PEFT save that reads a sharded weight: a trained one, or the base merged at the end),
  // else null: a model save gathers one unit at a time for rank 0 (take_part_in_save on the
  // others), and a LoRA adapter is whole on every rank.
  Zero3Params* units_whole_for_save(bool final_output) const;
  // On a rank that does not write: the gathers a model save on rank 0 runs (nothing otherwise).
  void take_part_in_save() const;
  // The micro-batches of an update: gradient_accumulation_steps, or all of an epoch's when it has
  // fewer (accumulation_for_epoch). Set when train() begins.
  int64_t accumulation_steps() const { return accumulation_; }
  // The micro-batches of the update under way (transformers' current_gradient_accumulation_steps):
  // accumulation_steps(), or fewer for an epoch's last update when the epoch's micro-batches are
  // not a multiple of it; what a loss averaged over accumulation divides by.
  int64_t current_accumulation_steps() const { return current_accumulation_; }

 private:
  // What a checkpoint saves besides the weights and the optimizer, taken when an update begins
  // (trainers/common/checkpoint_save.cpp): a stop in the middle of an update saves the one before
  // it.
  struct ResumePoint {
    nlohmann::json data_state;
    double epoch = 0;
    int64_t num_tokens = 0;
    nlohmann::json rng;  // the random streams' offsets: {"lora_dropout": n} under LoRA
  };
  ResumePoint resume_point() const;
  nlohmann::json rng_state() const;
  // Restores rng_state()'s offsets; returns a note when the checkpoint lacks one this run draws.
  std::string set_rng_state(const nlohmann::json& s);
  void build_optimizer();
  // model_only: --save_only_model's checkpoint (no optimizer state; a stop's save is always whole,
  // since it exists to be resumed).
  void save_checkpoint(int64_t step, MetricsLogger& log, const ResumePoint& at,
                       bool model_only = false);
  // Restores the model, optimizer, counters, data position and random streams
  // (trainers/common/resume.cpp); returns a line for the log ("" when there is nothing to say).
  std::string load_checkpoint(const std::string& dir);
  // The weights of checkpoint `dir` (a resume, or load_best_model_at_end), ZeRO-3 resharded.
  void load_weights(const std::string& dir);
  // This rank's files of a data-parallel checkpoint (data position and random streams; ZeRO:
  // optimizer shard).
  void write_rank_files(const std::string& dir, int rank, const ResumePoint& at,
                        bool model_only) const;
  // Whether a stop requested by a signal is honoured before the next micro-batch of an update of
  // `micro_batches` (data parallel: agreed by every rank, so that all abandon the same update).
  bool stop_before_micro_batch(size_t micro_batches) const;
  double grad_norm() const;
  void zero_grads();
  // Rank 0 writes files; the others only compute.
  bool writes_files() const;
  nlohmann::json memory_report(const nlohmann::json& savings) const;
  // evaluate() logged as an eval_* record at the current step, the best metric updated and, when
  // `steers_schedule` (transformers: not on start nor after training), reduce_lr_on_plateau
  // stepped; the record (null without evaluation data).
  nlohmann::json run_evaluation(MetricsLogger& log, bool steers_schedule);
  // transformers' trainer_state.json fields of a checkpoint (log_history, best_*, ...).
  nlohmann::json hf_trainer_state(double epoch) const;
  // A logged record as log_history keeps it: numbers only (the memory snapshot left out).
  void add_to_history(const nlohmann::json& record);

  std::vector<Optimizer::Param> trainable_;
  std::unique_ptr<Optimizer> optimizer_;
  ZeroOptimizer* zero_ = nullptr;             // optimizer_ when ZeRO shards it
  std::unique_ptr<Zero3Params> zero3_;        // stage 3: where the sharded parameters live
  std::unique_ptr<GradientBuckets> buckets_;  // data parallel without ZeRO
  LrScheduler scheduler_;
  int64_t total_steps_ = 0;
  int64_t accumulation_ = 1;
  int64_t current_accumulation_ = 1;
  int64_t step_ = 0;
  int64_t num_tokens_ = 0;
  int64_t consecutive_nonfinite_ = 0;
  int64_t skipped_steps_ = 0;
  std::set<int64_t> nan_steps_;
  RowGradSink row_grad_sink_;
  int64_t stop_after_ = -1;
  bool install_signal_handlers_ = true;
  StepCallback step_callback_;
  std::function<void(int64_t update, size_t micro_batch)> micro_batch_hook_;
  std::function<void(const std::string& dir)> save_hook_;
  int64_t saved_step_ = -1;      // the step of the checkpoint this run saved last
  int64_t evaluated_step_ = -1;  // the step of the last evaluation
  // logging_steps, save_steps and eval_steps in updates (ratios resolved), set by train().
  int64_t logging_every_ = 1, save_every_ = 0, eval_every_ = 0;
  BestModel best_;
  nlohmann::json log_history_ = nlohmann::json::array();
  MetricsLogger* log_ = nullptr;  // while train() runs
  OffloadStats offload_totals_;
  int64_t rss_at_start_ = 0;  // resident set when the loop began (bytes)
  // Data parallel: wall seconds of the updates, and of this rank's collectives among them.
  double step_seconds_ = 0, comm_seconds_ = 0;
  int64_t timed_updates_ = 0;
};

}  // namespace leantune
