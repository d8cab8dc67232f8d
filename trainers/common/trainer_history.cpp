// What a run keeps of its logs for transformers' tools: the evaluation step (Trainer::
// run_evaluation), log_history (every logged record, numbers only) and a checkpoint's
// trainer_state.json in transformers' TrainerState schema (Trainer::hf_trainer_state). The
// fields are those of transformers 5's TrainerState dataclass and no others, so that
// TrainerState.load_from_json reads the file; leantune's own resume state is
// leantune_state.json (trainers/common/checkpoint.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>

#include "engine/autograd.h"
#include "engine/device_peaks.h"
#include "engine/mem_phase.h"
#include "loaders/fs_util.h"
#include "trainers/common/checkpoint.h"
#include "trainers/common/trainer.h"

namespace leantune {

nlohmann::json Trainer::run_evaluation(MetricsLogger& log, bool steers_schedule) {
  const auto start = std::chrono::steady_clock::now();
  std::optional<nlohmann::json> metrics = evaluate();
  // ZeRO-3: the evaluation's forwards are no training pass; their prefetches end with it.
  if (zero3_) zero3_->end_forward_only();
  if (!metrics) return nullptr;
  nlohmann::json rec = {{"step", step_}, {"epoch", epoch_progress()}};
  for (const auto& [k, v] : metrics->items()) rec["eval_" + k] = v;
  rec["eval_runtime"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  evaluated_step_ = step_;
  update_best(best_, args_, rec, step_);
  if (steers_schedule) scheduler_.observe(rec[best_metric_key(args_)].get<double>());
  log.log(rec);
  add_to_history(rec);
  return rec;
}

nlohmann::json Trainer::evaluate_in_batches(int64_t rows, const EvalBatch& batch) {
  NoGradGuard no_grad;
  MemPhaseGuard phase(MemPhaseKind::kEvaluation);
  AdapterEvalScope eval(peft_);
  MetricWindow window;
  double loss_sum = 0;
  const int64_t bs = args_.per_device_eval_batch_size;
  for (int64_t start = 0; start < rows; start += bs) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(rows, start + bs); ++i) idx.push_back(i);
    auto [loss, metrics] = batch(idx);
    loss_sum += loss * static_cast<double>(idx.size());
    window.add(metrics);
  }
  nlohmann::json out = window.take();
  out["loss"] = loss_sum / static_cast<double>(std::max<int64_t>(rows, 1));
  return out;
}

void Trainer::add_to_history(const nlohmann::json& record) {
  nlohmann::json h = nlohmann::json::object();
  for (const auto& [k, v] : record.items())
    if (v.is_number() && std::isfinite(v.get<double>())) h[k] = v;
  log_history_.push_back(std::move(h));
}

nlohmann::json Trainer::hf_trainer_state(double epoch) const {
  double trainable = 0;
  for (const auto& p : trainable_) trainable += static_cast<double>(p.tensor.numel());
  const double flops_per_token =
      training_flops_per_token(static_cast<double>(model_->num_parameters()), trainable);
  nlohmann::json best_checkpoint = nullptr, best_metric = nullptr, best_step = nullptr;
  if (best_.metric) {
    best_metric = *best_.metric;
    best_step = best_.step;
    if (!best_.checkpoint.empty()) best_checkpoint = best_.checkpoint;
  }
  return {{"epoch", epoch},
          {"global_step", step_},
          {"max_steps", total_steps_},
          {"logging_steps", logging_every_},
          {"eval_steps", eval_every_ > 0 ? eval_every_ : logging_every_},
          {"save_steps", save_every_},
          {"train_batch_size", args_.per_device_train_batch_size},
          {"num_train_epochs", static_cast<int64_t>(std::ceil(args_.num_train_epochs))},
          {"num_input_tokens_seen", num_tokens_},
          {"total_flos", flops_per_token * static_cast<double>(num_tokens_)},
          {"log_history", log_history_},
          {"best_metric", best_metric},
          {"best_global_step", best_step},
          {"best_model_checkpoint", best_checkpoint},
          {"is_local_process_zero", true},
          {"is_world_process_zero", true},
          {"is_hyper_param_search", false},
          {"trial_name", nullptr},
          {"trial_params", nullptr},
          {"stateful_callbacks", nlohmann::json::object()}};
}

nlohmann::json read_log_history(const std::string& dir) {
  const std::string path = dir + "/trainer_state.json";
  if (!std::filesystem::exists(path) || checkpoint_state_path(dir) == path)
    return nlohmann::json::array();
  const nlohmann::json j = parse_json_strict(read_text_file(path), path, 64);
  const auto it = j.find("log_history");
  LT_CHECK_INPUT(j.is_object() && it != j.end() && it->is_array(), path,
                 ": key 'log_history' must be a list of records");
  for (const auto& r : *it)
    LT_CHECK_INPUT(r.is_object(), path, ": log_history holds ", printable(r.dump(), 60),
                   ", not a record");
  return *it;
}

}  // namespace leantune
