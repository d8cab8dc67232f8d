// The data side of the trainers that batch whole dataset rows (dpo, kto, reward): their rows in
// RowBatches (trainers/common/row_batches.h) sharded over data_comm(), the collated micro-batches
// fetched by next_micro_batch and queued (Pending) until compute_loss takes them, a
// MetricWindow of the per-micro-batch metrics that log_metrics averages, the evaluation rows
// (Data, --eval_dataset) and the reference model (dpo, kto). The position in the epoch is the
// checkpoint's data state; a stop that abandons an update drops what it fetched.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loaders/data_config.h"
#include "loaders/jsonl.h"
#include "models/ref_model.h"
#include "trainers/common/data_options.h"
#include "trainers/common/metrics.h"
#include "trainers/common/row_batches.h"
#include "trainers/common/trainer.h"

namespace leantune {

// The DataConfig of a row-batch trainer: the shared dataset options (row_dataset_table), its
// max_length, and the batch size and seed of its TrainingArguments.
inline DataConfig row_data_config(const Options& o, const TrainingArguments& args,
                                  int64_t max_length) {
  DataConfig dc;
  row_dataset_table().read_into(o, dc);
  dc.max_length = max_length;
  dc.per_device_train_batch_size = args.per_device_train_batch_size;
  dc.seed = args.seed;
  return dc;
}

// The training rows and, when `eval` names a file, the evaluation rows, both read by `load`
// (Data load(const JsonlSource&, const DataConfig&)) after dc is checked and a max_length
// beyond the model's positions is warned about.
template <typename Data, typename Load>
std::pair<Data, std::optional<Data>> load_train_and_eval(const JsonlSource& train,
                                                         const std::string& eval,
                                                         const DataConfig& dc,
                                                         const DecoderModel& model, Load load) {
  validate_data_config(dc);
  warn_beyond_positions(dc.max_length, model);
  std::pair<Data, std::optional<Data>> out{load(train, dc), std::nullopt};
  if (!eval.empty()) out.second = load(JsonlSource(eval), dc);
  return out;
}

template <typename Pending, typename Data>
class RowBatchTrainer : public Trainer {
 public:
  // rows: the training rows (a micro-batch takes per_device_train_batch_size of them); shuffle:
  // a seeded order per epoch (else file order); what: their name in the data state.
  RowBatchTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
                  std::string tokenizer_dir, int64_t rows, bool shuffle, std::string what)
      : Trainer(std::move(args), std::move(model), std::move(options)),
        batches_(rows, args_.per_device_train_batch_size, args_.seed, shuffle, std::move(what)) {
    tokenizer_dir_ = std::move(tokenizer_dir);
  }

  const std::vector<nlohmann::json>& logged_metrics() const override { return window_.logged(); }
  // Evaluation rows (--eval_dataset); before set_reference, so that a precomputed reference
  // scores them too.
  void set_eval_data(Data eval) { eval_ = std::move(eval); }

 protected:
  bool has_evaluation() const override { return eval_.has_value(); }
  // The evaluation, or the precompute pass of a precomputed reference.
  bool uses_eval_batch_size() const override {
    return has_evaluation() || (ref_ && ref_->mode() == RefMode::kPrecomputed);
  }
  int64_t micro_batches_per_epoch() const override { return batches_.per_epoch(data_comm()); }
  double epoch_progress() const override { return batches_.progress(data_comm()); }
  nlohmann::json data_state() const override { return batches_.state(); }
  void set_data_state(const nlohmann::json& s) override {
    batches_.set_state(s, data_comm());
    pending_.clear();  // fetched by an update that a stop abandoned
  }
  nlohmann::json log_metrics() override { return window_.take(); }
  void discard_micro_batches(size_t count) override {
    LT_CHECK(count <= pending_.size(), "discard_micro_batches: ", count, " of ", pending_.size());
    pending_.erase(pending_.end() - static_cast<std::ptrdiff_t>(count), pending_.end());
  }

  // Queues a collated micro-batch (`member`: its Batch, the one the loop runs) until
  // compute_loss takes it, and returns that Batch; counts what padding-free collation avoided
  // (the pad tokens that padding each sequence to the micro-batch's longest would have added)
  // and the largest micro-batch, for the memory report.
  Batch queue_micro_batch(Pending p, Batch Pending::*member, bool padding_free,
                          BatchReport* report) {
    const Batch& batch = p.*member;
    if (padding_free) {
      int64_t longest = 0;
      const std::vector<int64_t> cu = batch.cu_seqlens.to_i64();
      for (size_t i = 1; i < cu.size(); ++i) longest = std::max(longest, cu[i] - cu[i - 1]);
      padded_tokens_avoided_ += longest * batch.stats.sequences - batch.stats.real_tokens;
    }
    max_micro_tokens_ = std::max(max_micro_tokens_, batch.num_tokens());
    if (report) {
      report->real_tokens = batch.stats.real_tokens;
      report->pad_tokens = batch.stats.pad_tokens;
    }
    Batch b = batch;
    pending_.push_back(std::move(p));
    return b;
  }

  RowBatches batches_;
  std::optional<Data> eval_;
  std::unique_ptr<ReferenceModel> ref_;  // dpo, kto (null for reward)
  std::deque<Pending> pending_;          // fetched micro-batches not yet through compute_loss
  MetricWindow window_;
  int64_t padded_tokens_avoided_ = 0;
  int64_t max_micro_tokens_ = 0;  // tokens of the largest micro-batch
};

}  // namespace leantune
