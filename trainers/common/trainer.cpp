// The shared training loop, Trainer::train(), and its set-up: training options, optimizer, data
// parallel and ZeRO, PEFT saves (see trainer.h; checkpoints in checkpoint_save.cpp and resume.cpp).
#include "trainers/common/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "dist/dist_options.h"
#include "dist/zero.h"
#include "engine/autograd.h"
#include "engine/blas_kernels.h"
#include "engine/cuda_api.h"
#include "engine/device_peaks.h"
#include "engine/gemm_tuning.h"
#include "engine/host_memory.h"
#include "engine/log.h"
#include "engine/mem_phase.h"
#include "engine/ops.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "trainers/common/checkpoint.h"
#include "trainers/common/memory_trace_scope.h"
#include "trainers/common/model_io.h"
#include "trainers/common/offload_options.h"
#include "trainers/common/optim_options.h"
#include "trainers/common/output_path.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/step_profile.h"
#include "trainers/common/tfevents.h"
#include "trainers/common/trainer_spec.h"

namespace leantune {

namespace {
bool no_decay(const std::string& name) {
  return name.find("norm") != std::string::npos ||
         (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0);
}

// Model FLOPs utilisation of this rank's GPU at `tokens_per_second` (engine/device_peaks.h); 0 on
// the CPU, in f32, or on a GPU whose peak is not in the table.
double mfu(const DecoderModel& model, const std::vector<Optimizer::Param>& trainable,
           double tokens_per_second) {
  const Device dev = model.device();
  if (dev.is_cpu() || (model.dtype() != DType::kBF16 && model.dtype() != DType::kF16)) return 0.0;
  const double peak = peak_bf16_flops(cuda_device_name(dev.index));
  if (peak <= 0) return 0.0;
  double n_trainable = 0;
  for (const auto& p : trainable) n_trainable += static_cast<double>(p.tensor.numel());
  return tokens_per_second *
         training_flops_per_token(static_cast<double>(model.num_parameters()), n_trainable) / peak;
}
}  // namespace

std::string stopped_line(const std::string& command, int64_t steps) {
  if (steps == 0) return command + ": stopped before the first update completed; nothing to save";
  return command + ": stopped at step " + std::to_string(steps) +
         "; resume with --resume_from_checkpoint latest";
}

Trainer::~Trainer() = default;

nlohmann::json Trainer::chunked_loss_saving(int64_t tokens) const {
  const int64_t v = model_->config().vocab_size;
  return {{"largest_micro_batch_tokens", tokens},
          {"vocab_size", v},
          {"logits_bytes_not_materialised", tokens * v * 4 * 2},
          {"note", "f32 logits and their gradient for the largest micro-batch"}};
}

const std::vector<nlohmann::json>& Trainer::logged_metrics() const {
  static const std::vector<nlohmann::json> none;
  return none;
}

Trainer::Trainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options)
    : model_(std::move(model)), args_(std::move(args)), options_(std::move(options)) {
  model_->set_sequence_tiling(args_.tiling);
  // Bit-identical to one process means the same GEMM algorithms in every process: ranks that
  // tuned on their own could choose differently (engine/gemm_tuning.h).
  if (args_.comm.deterministic) gemm_tuning::set_mode(gemm_tuning::Mode::kOff);
}

void prepare_run(const TrainingArguments& args) {
  prepare_output_dir(args.output_dir, "output_dir");
  warn_once_about_blas_kernels();
  const HostMemoryPlan host = prepare_host_memory(args.max_memory_gib);
  if (host.cap > 0) log_message(LogLevel::kInfo, host.summary());
}

void warn_beyond_positions(int64_t max_length, const DecoderModel& model) {
  const int64_t positions = model.config().max_position_embeddings;
  if (max_length > 0 && positions > 0 && max_length > positions)
    log_message(LogLevel::kWarning, "warning: max_length " + std::to_string(max_length) +
                                        " is above the model's max_position_embeddings " +
                                        std::to_string(positions) +
                                        ": the positions past it were never trained");
}

void Trainer::set_peft(PeftSetup peft, std::string base_model_name_or_path, bool merge_adapter) {
  peft_ = std::move(peft);
  base_model_name_or_path_ = std::move(base_model_name_or_path);
  merge_adapter_ = merge_adapter;
}

void Trainer::set_quantized_base(QuantConfig cfg, QuantizeReport report) {
  quant_config_ = std::move(cfg);
  quant_report_ = report;
}

void Trainer::write_model_extras(const std::string& dir) const {
  if (!tokenizer_dir_.empty()) copy_tokenizer_files(tokenizer_dir_, dir);
}

std::vector<std::pair<std::string, Tensor>> Trainer::trainable_parameters() const {
  if (peft_.active()) return peft_.trainable_parameters(*model_);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : model_->named_parameters())
    if (t.requires_grad()) out.emplace_back(name, t);
  return out;
}

void Trainer::save_model(const std::string& dir, bool final_output) const {
  if (peft_.active()) {
    save_adapter_output(peft_, *model_, dir, final_output, base_model_name_or_path_, merge_adapter_,
                        [this](const std::string& d) { write_model_extras(d); });
    return;
  }
  // Checkpoints keep the compute dtype (bit-exact resume); the final model is written in it too
  // (f64 models, used by tests, are written as f32).
  const DType disk = model_->dtype() == DType::kF64 ? DType::kF32 : model_->dtype();
  model_->save(dir, final_output ? disk : model_->dtype());
  write_model_extras(dir);
}

void Trainer::load_model(const std::string& dir) {
  if (peft_.active()) return load_peft_checkpoint(peft_, *model_, dir);
  model_->load_weights(TensorStore::open(dir));
}

void Trainer::set_context_parallel(std::shared_ptr<ContextParallelGroups> groups,
                                   int64_t pad_token_id) {
  cp_groups_ = std::move(groups);
  cp_pad_token_id_ = pad_token_id;
}

bool Trainer::context_parallel() const { return cp_groups_ && cp_groups_->cp_size > 1; }

Communicator& Trainer::data_comm() const { return context_parallel() ? *cp_groups_->dp : comm(); }

Zero3Params* Trainer::units_whole_for_save(bool final_output) const {
  if (!zero3_ || !peft_.active()) return nullptr;
  return zero3_->trains_sharded() || (final_output && merge_adapter_) ? zero3_.get() : nullptr;
}

void Trainer::take_part_in_save() const {
  if (zero3_ && !peft_.active()) model_->take_part_in_save();
}

bool Trainer::counts_replicated_loss() const {
  return !context_parallel() || cp_groups_->cp_rank == 0;
}

void Trainer::build_optimizer() {
  trainable_.clear();
  for (const auto& [name, t] : trainable_parameters())
    trainable_.push_back({name, t, !no_decay(name)});
  LT_CHECK_INPUT(!trainable_.empty(), "nothing to train: no parameter requires a gradient");
  const OptimArguments oa{args_.optim, args_.optimizer_in_backward, args_.offload_optimizer};
  const AdamWConfig cfg{args_.learning_rate, args_.adam_beta1, args_.adam_beta2, args_.adam_epsilon,
                        args_.weight_decay};
  Communicator& comm = this->comm();
  zero_ = nullptr;
  buckets_.reset();
  if (comm.size() > 1 && args_.zero_stage == 0) {
    std::vector<Tensor> params;
    for (const auto& p : trainable_) params.push_back(p.tensor);
    buckets_ = std::make_unique<GradientBuckets>(comm, std::move(params), args_.reduce_bucket_size);
  }
  if (args_.zero_stage == 3 && comm.size() > 1 && !zero3_) {
    auto refuse = [](bool bad, const char* what) {
      LT_CHECK_INPUT(!bad, "option zero_stage 3: ", what, " is not built yet under stage 3");
    };
    refuse(args_.optimizer_in_backward, "--optimizer_in_backward");
    zero3_ = std::make_unique<Zero3Params>(comm, *model_, args_.stage3_param_persistence_threshold,
                                           args_.stage3_prefetch_bucket_size);
  }
  if (args_.zero_stage > 0 && comm.size() > 1) {
    LT_CHECK_INPUT(oa.optim == "adamw_torch" || oa.optim == "sgd", "options zero_stage ",
                   args_.zero_stage, " and optim ", oa.optim,
                   ": ZeRO shards elementwise optimizers (adamw_torch, sgd); adafactor factors "
                   "2-D shapes and the 8-bit states are blockwise");
    LT_CHECK_INPUT(oa.offload_optimizer == "none", "options zero_stage ", args_.zero_stage,
                   " and offload_optimizer ", oa.offload_optimizer, " cannot be combined yet");
    auto make_inner = [&oa](std::vector<Optimizer::Param> pieces, const AdamWConfig& c) {
      return make_optimizer(oa, std::move(pieces), c);
    };
    auto z = std::make_unique<ZeroOptimizer>(args_.zero_stage, comm, make_inner, trainable_, cfg,
                                             args_.reduce_bucket_size, zero3_.get());
    zero_ = z.get();
    optimizer_ = std::move(z);
  } else {
    // One rank owns every shard: ZeRO is the plain optimizer.
    optimizer_ = make_optimizer(oa, trainable_, cfg);
  }
}

double Trainer::grad_norm() const {
  double s = 0;
  for (const auto& p : trainable_) {
    Tensor g = p.tensor.grad();
    if (g.defined()) s += ops::sum_squares(g);
  }
  return std::sqrt(s);
}

Communicator& Trainer::comm() const { return comm_ ? *comm_ : world_communicator(args_.comm); }

bool Trainer::writes_files() const { return comm().rank() == 0; }

void Trainer::zero_grads() {
  for (auto& p : trainable_) p.tensor.zero_grad();
  if (zero_) zero_->drop_gradients();
}

nlohmann::json Trainer::memory_report(const nlohmann::json& savings) const {
  nlohmann::json snap = memory_snapshot(model_->device());
  nlohmann::json all_savings = savings;
  if (args_.activation_offloading)
    all_savings["activation_offloading"] = {
        {"bytes_offloaded_per_micro_batch_max", offload_totals_.host_bytes_peak},
        {"tensors_offloaded", offload_totals_.tensors_offloaded},
        {"bytes_offloaded", offload_totals_.bytes_offloaded},
        {"prefetches", offload_totals_.prefetches}};
  if (args_.gradient_checkpointing)
    all_savings["gradient_checkpointing"] = {
        {"note", "only each layer's input is kept between forward and backward"}};
  // Sequence tiling at the longest tiled forward: the MLP's [tokens x intermediate] gate, up and
  // activation never existed whole (models/sequence_tiling.h).
  if (const int64_t rows = model_->largest_tiled_rows(); rows > 0) {
    const int64_t chunk = model_->largest_tiled_chunk();
    const ModelConfig& mc = model_->config();
    all_savings["sequence_tiling"] = {
        {"chunk_tokens", chunk},
        {"largest_micro_batch_tokens", rows},
        {"intermediate_size", mc.intermediate_size},
        {"mlp_bytes_not_materialised", 3 * (rows - chunk) * mc.intermediate_size *
                                           static_cast<int64_t>(dtype_size(model_->dtype()))}};
  }
  {
    // Streaming weight loading (loaders/safetensors.h): one tensor's host copy at a time.
    int64_t largest = 0, total = 0;
    for (const auto& [name, p] : model_->named_parameters()) {
      const int64_t n = p.numel() * static_cast<int64_t>(dtype_size(p.dtype()));
      largest = std::max(largest, n);
      total += n;
    }
    all_savings["streaming_load"] = {{"largest_tensor_bytes", largest}, {"weight_bytes", total}};
  }
  nlohmann::json r = {
      {"device", model_->device().str()},
      {"peak_allocated", snap["peak_allocated"]},
      {"peak_reserved", snap["peak_reserved"]},
      {"peak_by_tag", nlohmann::json::object()},
      {"at_peak_by_tag", nlohmann::json::object()},
      {"phase_at_peak", snap["phase_at_peak"]},
      {"pinned_host_peak", pinned_allocator().stats().allocated.peak},
      {"pinned_host_peak_reserved", pinned_allocator().stats().reserved.peak},
      {"peak_rss", process_rss_bytes(true)},
      {"rss_at_train_start", rss_at_start_},
      {"optimizer",
       {{"optim", args_.optim},
        {"offload_optimizer", args_.offload_optimizer},
        {"state_bytes", optimizer_->state_bytes()},
        // Paged and offloaded states are host memory, not in the device figures.
        {"state_on_host", args_.offload_optimizer == "cpu" || args_.optim.rfind("paged_", 0) == 0 ||
                              model_->device().is_cpu()}}},
      {"savings", all_savings}};
  if (model_->device().is_cpu()) r["blas"] = blas_report().line();
  for (auto it = snap["by_tag"].begin(); it != snap["by_tag"].end(); ++it) {
    r["peak_by_tag"][it.key()] = it.value()["peak"];
    r["at_peak_by_tag"][it.key()] = it.value()["at_peak"];
  }
  Communicator& comm = this->comm();
  if (comm.size() > 1 && timed_updates_ > 0) {
    // This rank's time per update. The CPU collectives block the rank, so all of it is exposed;
    // stage 2's reductions inside backward are counted as communication, not compute.
    const double comm_s = comm_seconds_ + (zero_ ? zero_->comm_seconds() : 0.0) +
                          (buckets_ ? buckets_->comm_seconds() : 0.0) +
                          (zero3_ ? zero3_->comm_seconds() : 0.0);
    const double n = static_cast<double>(timed_updates_);
    r["distributed"] = {
        {"world_size", comm.size()},         {"zero_stage", zero_ ? args_.zero_stage : 0},
        {"backend", comm.backend_name()},    {"updates", timed_updates_},
        {"step_seconds", step_seconds_ / n}, {"compute_seconds", (step_seconds_ - comm_s) / n},
        {"comm_seconds", comm_s / n},        {"exposed_comm_seconds", comm_s / n}};
    // The ring attention's exchanges run inside forward and backward: counted as compute.
    if (args_.cp_size > 1) r["distributed"]["cp_size"] = args_.cp_size;
    if (zero3_) r["distributed"]["zero3"] = zero3_->report();
  }
  return r;
}

void Trainer::warn(const std::string& text) const {
  if (log_)
    log_->message(text, LogLevel::kWarning);
  else
    log_message(LogLevel::kWarning, text);
}

bool Trainer::stop_before_micro_batch(size_t micro_batches) const {
  Communicator& comm = this->comm();
  if (comm.size() == 1) return stop_requested();
  // One micro-batch per update: the stop agreed at the end of each update is as early.
  if (micro_batches == 1) return false;
  return comm.all_reduce_int(stop_requested() ? 1 : 0, ReduceOp::kMax) != 0;
}

int64_t accumulation_for_epoch(int64_t gradient_accumulation_steps, int64_t micro_batches_per_epoch,
                               bool warn) {
  if (gradient_accumulation_steps <= micro_batches_per_epoch) return gradient_accumulation_steps;
  if (warn)
    log_message(LogLevel::kWarning,
                "warning: gradient_accumulation_steps " +
                    std::to_string(gradient_accumulation_steps) + " is more than the " +
                    std::to_string(micro_batches_per_epoch) +
                    " micro-batch(es) of an epoch (per rank): each update accumulates the whole "
                    "epoch's " +
                    std::to_string(micro_batches_per_epoch) + ", as transformers' Trainer does");
  return micro_batches_per_epoch;
}

TrainResult Trainer::train() {
  StopSignalScope signals(install_signal_handlers_);
  // From here on a second stop signal is noted, not fatal: the first one leads to a save within
  // about a second, and that save must not be torn.
  SignalsDeferredScope deferred;
  TrainResult result;
  const int64_t per_epoch = micro_batches_per_epoch();
  LT_CHECK_INPUT(per_epoch > 0, "the training data yields no micro-batch");
  if (args_.learning_rate > 1.0 && comm().rank() == 0)
    log_message(LogLevel::kWarning, "warning: learning_rate " +
                                        std::to_string(args_.learning_rate) +
                                        " is above 1; fine-tuning rates are usually 1e-6 to 1e-3");
  // transformers refuses an evaluation strategy without evaluation data; no option goes unused.
  LT_CHECK_INPUT(args_.eval_strategy == "no" || has_evaluation(), "option --eval_strategy ",
                 args_.eval_strategy, ": this run has no evaluation data (give --eval_dataset)");
  LT_CHECK_INPUT(!args_.eval_on_start || has_evaluation(),
                 "option --eval_on_start: this run has no evaluation data (give --eval_dataset)");
  if (comm().rank() == 0) {
    // Options accepted (as transformers accepts them) that would do nothing in this run.
    const std::pair<const char*, bool> eval_options[] = {
        {"per_device_eval_batch_size", uses_eval_batch_size()},
        {"metric_for_best_model", has_evaluation()},
        {"greater_is_better", has_evaluation()}};
    for (const auto& [name, used] : eval_options)
      if (options_.is_set(name) && !used)
        log_message(LogLevel::kWarning, std::string("warning: option --") + name +
                                            " has no effect: this run has no evaluation data");
    if (args_.warmup_steps > 0 && (args_.lr_scheduler_type == "constant" ||
                                   args_.lr_scheduler_type == "reduce_lr_on_plateau"))
      log_message(LogLevel::kWarning, "warning: option --warmup_steps has no effect: the " +
                                          args_.lr_scheduler_type +
                                          " schedule has no warmup (as in transformers)");
  }
  accumulation_ =
      accumulation_for_epoch(args_.gradient_accumulation_steps, per_epoch, comm().rank() == 0);
  // transformers' Trainer: an epoch is ceil(M / accumulation) updates, its last one taking the
  // epoch's remaining micro-batches, so that no update spans two epochs.
  const int64_t updates_per_epoch =
      std::max<int64_t>(1, (per_epoch + accumulation_ - 1) / accumulation_);
  const int64_t last_accumulation =
      per_epoch % accumulation_ == 0 ? accumulation_ : per_epoch % accumulation_;
  total_steps_ = args_.max_steps > 0
                     ? args_.max_steps
                     : static_cast<int64_t>(std::ceil(args_.num_train_epochs * updates_per_epoch));
  LT_CHECK_INPUT(total_steps_ > 0, "no training steps (num_train_epochs too small)");
  logging_every_ = std::max<int64_t>(1, resolve_steps(args_.logging_steps, total_steps_));
  save_every_ = resolve_steps(args_.save_steps, total_steps_);
  eval_every_ = resolve_steps(args_.eval_steps, total_steps_);
  scheduler_ =
      LrScheduler::make(args_.lr_scheduler_type, args_.learning_rate, total_steps_,
                        args_.warmup_steps >= 1 ? static_cast<int64_t>(args_.warmup_steps) : 0,
                        args_.warmup_steps < 1 ? args_.warmup_steps : 0.0,
                        parse_lr_scheduler_kwargs(args_.lr_scheduler_kwargs));
  Communicator& comm = this->comm();
  const bool distributed = comm.size() > 1;
  LT_CHECK_INPUT(!distributed || !args_.optimizer_in_backward,
                 "option optimizer_in_backward: not supported with data parallel (", comm.size(),
                 " ranks): parameters would be updated before their gradients "
                 "are summed over the ranks");
  LT_CHECK_INPUT(!distributed || model_->device().is_cpu() || comm.backend_name() == "nccl",
                 "data parallel on ", model_->device().str(), " needs --comm_backend nccl (the ",
                 comm.backend_name(), " backend moves host memory)");
  LT_CHECK_INPUT(args_.cp_size == 1 || supports_context_parallel(), "option cp_size ",
                 args_.cp_size, ": this trainer does not split sequences over ranks (",
                 context_parallel_trainer_names(), " have context parallelism)");
  build_optimizer();
  // Before anything else writes: killed saves may have left the disk full of temporary folders.
  const StaleCleanup cleaned =
      writes_files() ? clean_stale_checkpoint_files(args_.output_dir) : StaleCleanup{};
  if (cleaned.removed > 0 || cleaned.restored > 0)
    log_message(LogLevel::kInfo, args_.output_dir + ": removed " + std::to_string(cleaned.removed) +
                                     " temporary checkpoint folder(s) of interrupted saves (" +
                                     format_bytes(cleaned.bytes) + "), restored " +
                                     std::to_string(cleaned.restored) + " checkpoint(s)");
  bool resumed = false;
  std::string resume_note;
  if (!args_.resume_from_checkpoint.empty()) {
    const std::string dir = resolve_checkpoint(args_.resume_from_checkpoint, args_.output_dir);
    resume_note = load_checkpoint(dir);
    resumed = true;
    if (step_ >= total_steps_) {
      result.steps = step_;
      result.nothing_to_do = true;
      result.resumed_from = dir;
      result.total_steps = total_steps_;
      return result;
    }
  }
  if (writes_files()) std::filesystem::create_directories(args_.output_dir);
  MetricsLogger log(writes_files() ? args_.output_dir + "/metrics.jsonl" : std::string(),
                    total_steps_, resumed, step_);
  log_ = &log;
  // Cleared however train() is left: the logger lives in this frame.
  struct ClearLog {
    MetricsLogger*& p;
    ~ClearLog() { p = nullptr; }
  } clear_log{log_};
  if (writes_files() && reports_to_tensorboard(args_))
    log.report_to_tensorboard(tensorboard_log_dir(args_.output_dir), options_.to_json().dump(2));
  if (resumed) log.message("resumed from step " + std::to_string(step_));
  if (!resume_note.empty()) log.message(resume_note);
  on_train_begin(log);
  if (args_.eval_on_start) run_evaluation(log, false);
  StepPhaseGuard setup_phase("between steps");
  rss_at_start_ = process_rss_bytes(false);
  // Host memory outside the allocators before the first step: code, libraries, tokenizer, data.
  resident_before_training_ =
      std::max<int64_t>(0, rss_at_start_ - allocator(Device::cpu()).stats().reserved.current -
                               pinned_allocator().stats().reserved.current);
  allocator(model_->device()).reset_peak_stats();
  MemoryTraceScope trace(args_.memory_trace, step_, step_ + args_.memory_trace_steps,
                         allocator(model_->device()));
  StepProfileRun profile(args_.profile_steps, step_ + 1, total_steps_, model_->device(),
                         writes_files() ? args_.output_dir + "/profile.json" : "");

  // The logging window: losses and norms of the applied updates (a skipped one's are not finite),
  // and the skipped count.
  double window_loss = 0, window_norm = 0;
  int64_t window_steps = 0, window_skipped = 0, window_tokens = 0, window_real = 0,
          window_total = 0;
  auto window_start = std::chrono::steady_clock::now();

  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  nlohmann::json last_logged;  // for the model card
  nlohmann::json last_eval;    // the record of the last evaluation
  while (step_ < total_steps_) {
    const int64_t update = step_ + 1;
    current_accumulation_ =
        step_ % updates_per_epoch == updates_per_epoch - 1 ? last_accumulation : accumulation_;
    const auto update_start = std::chrono::steady_clock::now();
    profile.begin_update(update);
    // What a stop in the middle of this update saves: the state after the last completed one.
    const ResumePoint before = resume_point();
    bool abandoned = false;
    // Fetch the whole accumulated batch first: the loss normaliser spans all of it.
    std::vector<Batch> micro;
    std::vector<BatchReport> reports;
    int64_t normalizer = 0;
    try {
      for (int64_t i = 0; i < current_accumulation_; ++i) {
        // One process: a stop is honoured between fetches, and inside a generation phase (the
        // online trainers throw StopRequested from it). Data parallel: between micro-batches.
        if (!distributed) throw_if_stop_requested();
        BatchReport rep;
        micro.push_back(next_micro_batch(&rep));
        reports.push_back(rep);
        normalizer += loss_tokens(micro.back());
      }
    } catch (const StopRequested&) {
      abandoned = true;
    }
    // Data parallel: the loss is normalised by the loss tokens of the whole global batch.
    if (distributed) {
      const auto t = std::chrono::steady_clock::now();
      normalizer = comm.all_reduce_int(normalizer);
      comm_seconds_ += seconds_since(t);
    }
    if (normalizer == 0 && !abandoned) {
      // Packed or truncated data can leave an accumulated batch with nothing to predict: the
      // update would only apply weight decay and stale momentum. Skipped and counted.
      ++skipped_steps_;
      discard_micro_batches(micro.size());
      step_ = update;
      result.losses.push_back(0.0);
      log.message("step " + std::to_string(update) +
                  ": no label token in the batch, update skipped");
      continue;
    }
    // --deterministic_comm: the gradients are summed after every micro-batch, in one process's
    // order (zero.h), so that N ranks x G micro-batches equal one process x N*G bit for bit.
    const bool fold_each =
        distributed && comm.deterministic() && micro.size() > 1 && !args_.optimizer_in_backward;
    double step_loss = 0;
    bool finite = true;
    double backward_norm = 0;  // optimizer_in_backward: the norm of the gradients it applied
    for (size_t i = 0; i < micro.size() && !abandoned; ++i) {
      if (micro_batch_hook_) micro_batch_hook_(update, i);
      if (stop_before_micro_batch(micro.size())) {
        abandoned = true;
        break;
      }
      // One offloader per micro-batch, around its forward and backward.
      std::unique_ptr<ActivationOffloader> offloader =
          make_step_offloader(static_cast<const OffloadArguments&>(args_), model_->device());
      // ZeRO-3: a weight saved in forward is gathered again when backward unpacks it; every
      // other saved tensor goes to the offloader's hooks, if any.
      std::optional<SavedTensorHooksGuard> z3_hooks;
      if (zero3_) z3_hooks.emplace(zero3_->saved_tensor_hooks(current_saved_tensor_hooks()));
      // optimizer_in_backward: alive from forward on, since a fused loss may update the LM head
      // block by block in its forward (row_grad_sink()).
      std::unique_ptr<OptimizerInBackward> in_bwd;
      if (args_.optimizer_in_backward) {
        in_bwd = std::make_unique<OptimizerInBackward>(*optimizer_, scheduler_.lr(step_));
        if (in_bwd->takes_rows() && nan_steps_.count(update) == 0)
          row_grad_sink_ = [&in_bwd](const Tensor& p, int64_t row0, const Tensor& g) {
            in_bwd->apply_rows(p, row0, g);
          };
      }
      Tensor loss;
      {
        StepPhaseGuard phase("forward");
        loss = compute_loss(micro[i], static_cast<double>(normalizer));
        row_grad_sink_ = nullptr;
      }
      if (nan_steps_.count(update)) loss = ops::scale(loss, std::nan(""));
      const double lv = loss.item();
      step_loss += lv;
      if (!std::isfinite(lv)) finite = false;
      if (in_bwd) {
        // Parameters are updated inside backward: a non-finite loss skips backward itself.
        if (finite && loss.requires_grad()) {
          StepPhaseGuard phase("backward");
          loss.backward();
        }
        backward_norm = in_bwd->grad_norm();
        if (!in_bwd->finite()) finite = false;
      } else if (loss.requires_grad()) {
        StepPhaseGuard phase("backward");
        // The last micro-batch's backward (every one's, when folding in rank order) sums each
        // bucket (data parallel) or reduce-scatters each unit (ZeRO-2/3) as soon as its
        // gradients are complete.
        const bool reduce_now = i + 1 == micro.size() || fold_each;
        std::unique_ptr<ZeroOptimizer::BackwardReducer> reducer;
        std::unique_ptr<GradientBuckets::BackwardReducer> bucket_reducer;
        if (zero_ && zero_->stage() >= 2 && reduce_now)
          reducer = std::make_unique<ZeroOptimizer::BackwardReducer>(*zero_);
        if (buckets_ && reduce_now)
          bucket_reducer = std::make_unique<GradientBuckets::BackwardReducer>(*buckets_);
        loss.backward();
      }
      if (fold_each && i + 1 < micro.size()) {
        StepPhaseGuard phase("gradient reduction");
        zero_ ? zero_->fold_micro_batch() : buckets_->fold_micro_batch();
      }
      if (zero3_) zero3_->end_backward();
      z3_hooks.reset();
      if (offloader) offload_totals_.add_run_totals(offloader->stats());
      num_tokens_ += reports[i].real_tokens;
      window_tokens += reports[i].real_tokens;
      window_real += reports[i].real_tokens;
      window_total += reports[i].real_tokens + reports[i].pad_tokens;
    }
    if (abandoned) {
      // The partial gradients are dropped, and the data position, token count and random streams
      // go back to where the update began: the trainer is the last completed update's, as saved.
      zero_grads();
      set_data_state(before.data_state);
      num_tokens_ = before.num_tokens;
      set_rng_state(before.rng);
      result.interrupted = true;
      if (step_ == 0) {
        log.message("stopped by a signal during update 1; nothing to save");
      } else {
        if (saved_step_ != step_) save_checkpoint(step_, log, before);
        log.message("stopped by a signal during update " + std::to_string(update) +
                    ", which is abandoned; checkpoint-" + std::to_string(step_) +
                    " holds the state after update " + std::to_string(step_));
      }
      break;
    }
    if (distributed) {
      // Every rank must agree on skipping; the gradients and the loss are summed over ranks.
      const auto t = std::chrono::steady_clock::now();
      finite = comm.all_reduce_int(finite ? 0 : 1, ReduceOp::kMax) == 0;
      step_loss = comm.all_reduce_scalar(step_loss);
      comm_seconds_ += seconds_since(t);
      if (finite) {
        // The buckets and units not summed during backward (timed by their owners).
        StepPhaseGuard phase("gradient reduction");
        if (zero_)
          zero_->reduce_gradients();
        else
          buckets_->reduce_all();
      }
    }
    const double norm = args_.optimizer_in_backward ? backward_norm
                        : zero_                     ? zero_->grad_norm()
                                                    : grad_norm();
    if (!finite || !std::isfinite(norm)) {
      ++consecutive_nonfinite_;
      ++skipped_steps_;
      log.message("step " + std::to_string(update) + ": non-finite " +
                  (finite ? std::string("gradient") : std::string("loss")) + ", update skipped (" +
                  std::to_string(consecutive_nonfinite_) + " in a row)");
      zero_grads();
      if (consecutive_nonfinite_ >= args_.max_consecutive_nonfinite)
        LT_THROW(ErrorKind::kNonFinite, "stopping at step ", update, ": ", consecutive_nonfinite_,
                 " consecutive non-finite steps");
    } else {
      consecutive_nonfinite_ = 0;
      double scale = 1.0;
      if (args_.max_grad_norm > 0) scale = std::min(1.0, args_.max_grad_norm / (norm + 1e-6));
      if (!args_.optimizer_in_backward) {
        StepPhaseGuard phase("optimizer step");
        MemPhaseGuard alloc_phase(MemPhaseKind::kOptimizer);
        optimizer_->step(scheduler_.lr(step_), scale);
      }
      zero_grads();
    }
    const double lr_used = scheduler_.lr(step_);
    step_seconds_ += seconds_since(update_start);
    ++timed_updates_;
    step_ = update;
    result.losses.push_back(step_loss);
    const bool skipped = !finite || !std::isfinite(norm);
    if (skipped) {
      ++window_skipped;
    } else {
      window_loss += step_loss;
      window_norm += norm;
      ++window_steps;
    }
    profile.end_update(step_, log);
    trace.after_step(step_, log);
    bool callback_stop = false;
    if (step_callback_) {
      const nlohmann::json rec = {
          {"step", step_},
          {"total_steps", total_steps_},
          {"epoch", epoch_progress()},
          {"loss", step_loss},
          {"grad_norm", finite ? norm : 0.0},
          {"learning_rate", lr_used},
          {"num_tokens", num_tokens_},
          {"skipped", skipped},
          {"allocated", allocator(model_->device()).stats().allocated.current}};
      callback_stop = !step_callback_(rec);
    }

    if (step_ % logging_every_ == 0 || step_ == total_steps_ ||
        (args_.logging_first_step && step_ == 1)) {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      const double tokens_per_second = secs > 0 ? window_tokens / secs : 0.0;
      nlohmann::json rec = {
          {"step", step_},
          {"epoch", epoch_progress()},
          {"learning_rate", lr_used},
          {"tokens_per_second", tokens_per_second},
          {"num_tokens", num_tokens_},
          {"padding_efficiency",
           window_total > 0 ? static_cast<double>(window_real) / window_total : 1.0},
          {"memory", memory_snapshot(model_->device())}};
      // HF's logging_nan_inf_filter: the mean over the window's finite losses; none, no key.
      if (window_steps > 0) {
        rec["loss"] = window_loss / static_cast<double>(window_steps);
        rec["grad_norm"] = window_norm / static_cast<double>(window_steps);
      }
      if (window_skipped > 0) rec["nonfinite_steps"] = window_skipped;
      if (const double u = mfu(*model_, trainable_, tokens_per_second); u > 0) rec["mfu"] = u;
      rec.update(log_metrics());
      log.log(rec);
      add_to_history(rec);
      last_logged = rec;
      window_loss = window_norm = 0;
      window_steps = window_skipped = window_tokens = window_real = window_total = 0;
      window_start = std::chrono::steady_clock::now();
    }
    if (eval_due(args_, eval_every_, step_, updates_per_epoch))
      last_eval = run_evaluation(log, true);
    bool stop = stop_requested() || (stop_after_ > 0 && step_ >= stop_after_) || callback_stop;
    // A signal or a callback on one rank stops all of them at the same step.
    if (distributed) stop = comm.all_reduce_int(stop ? 1 : 0, ReduceOp::kMax) != 0;
    // After the last update the run is complete: it ends as usual, writing the final model (no
    // longer than a checkpoint would take), which a resume could not write any more.
    if (step_ >= total_steps_) stop = false;
    const bool save_due =
        step_ < total_steps_ &&
        (args_.save_strategy == "steps"   ? save_every_ > 0 && step_ % save_every_ == 0
         : args_.save_strategy == "epoch" ? step_ % updates_per_epoch == 0
                                          : false);
    if (save_due || stop)
      save_checkpoint(step_, log, resume_point(), args_.save_only_model && !stop);
    if (stop) {
      log.message("stopped at step " + std::to_string(step_) + " (checkpoint saved)");
      result.interrupted = true;
      break;
    }
  }
  trace.stop();
  profile.finish(log);
  if (deferred_signals() > 0)
    log.message(std::to_string(deferred_signals()) +
                " more stop signal(s) arrived during the stop and were deferred until it was done");
  log.finish();
  result.steps = step_;
  result.skipped_steps = skipped_steps_;
  if (!result.interrupted) {
    if (args_.load_best_model_at_end && !best_.checkpoint.empty() && best_.step != step_) {
      load_weights(best_.checkpoint);
      log.message("loaded the best model, " + best_.checkpoint + " (" + best_metric_key(args_) +
                  " " + std::to_string(*best_.metric) + "), for the final model");
      evaluated_step_ = -1;  // the weights changed: the final evaluation is the best model's
    }
    if (evaluated_step_ != step_) last_eval = run_evaluation(log, false);
    if (last_eval.is_object()) {
      result.final_eval = last_eval;
      if (last_eval.contains("eval_loss")) result.final_eval_loss = last_eval["eval_loss"];
    }
    // ZeRO-3: the report is the training's, taken before the final save (as a checkpoint's).
    // The model stays sharded: its units are gathered for each use while this trainer lives.
    if (zero3_) result.memory = memory_report(technique_savings());
    const AllUnitsGathered gathered(units_whole_for_save(true));
    if (writes_files()) {
      save_model(args_.output_dir, true);
      write_model_card(args_.output_dir, last_logged);
    } else
      take_part_in_save();
  }
  trace.finish(log);
  if (distributed) comm.barrier();  // the output is complete when any rank returns
  if (result.memory.is_null()) result.memory = memory_report(technique_savings());
  return result;
}

}  // namespace leantune
