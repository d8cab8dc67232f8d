// SFT: causal-LM fine-tuning on TRL-format JSONL data (trainer_bin sft).
//
// Data: loaders/examples.h (tokenisation, loss masks, truncation) -> loaders/data_loader.h
// (packing, padding-free collation, shuffling) -> flat varlen Batches. Loss: the decoder's
// chunked linear cross-entropy over shifted labels, normalised by the label tokens of the whole
// accumulated batch.
//
// Also what the other trainers share with sft: the model side of a run (SftModel, load_sft_model:
// tokenizer, model, LoRA adapters, quantized base; used by dpo, kto and the online trainers), the
// adapter's base name (adapter_base_name); the end-of-run memory report is
// trainers/common/memory_report.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/context_parallel.h"
#include "loaders/data_loader.h"
#include "loaders/tokenizer.h"
#include "models/peft_io.h"
#include "models/quantize_model.h"
#include "trainers/common/memory_report.h"
#include "trainers/common/model_source.h"
#include "trainers/common/trainer.h"

namespace leantune {

// sft's own options (TRL's SFTConfig names and defaults); its table also declares the packing,
// dataset, chat, PEFT, quantization and training groups, in --help order.
struct SftArguments : ModelSource {
  std::optional<int64_t> max_length = 1024;  // none: no limit
  std::string truncation_mode = "keep_start";
  bool packing = false;
  std::optional<bool> padding_free;  // none: on with bfd packing
  std::optional<int64_t> pad_to_multiple_of;
  bool use_liger_kernel = true;
};
const OptionTable<SftArguments>& sft_table();
// The sft command's options; `command` names the usage line (estimate takes the same options).
Options sft_options(const std::string& command = "sft");

struct SftSetup {
  std::string model_name_or_path;  // empty = the built-in embedded model
  std::string tokenizer_dir;
  std::string model_config;  // embedded: the config.json of the random-init model
  std::string dataset;
  bool embedded = false;
};

class SftTrainer final : public Trainer {
 public:
  SftTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
             std::shared_ptr<Tokenizer> tokenizer, std::string tokenizer_dir,
             std::shared_ptr<DataLoader> train, std::shared_ptr<DataLoader> eval,
             DataStats train_stats, bool fused_loss);

  const DataStats& train_stats() const override { return train_stats_; }
  // TRL's training metrics of every logged record: entropy and mean_token_accuracy.
  const std::vector<nlohmann::json>& logged_metrics() const override { return window_.logged(); }

 protected:
  int64_t micro_batches_per_epoch() const override { return train_->batches_per_epoch(); }
  Batch next_micro_batch(BatchReport* report) override;
  int64_t loss_tokens(const Batch& b) const override;
  Tensor compute_loss(const Batch& b, double normalizer) override;
  std::optional<nlohmann::json> evaluate() override;
  bool has_evaluation() const override { return eval_ != nullptr; }
  double epoch_progress() const override;
  nlohmann::json data_state() const override;
  void set_data_state(const nlohmann::json& s) override;
  void on_train_begin(MetricsLogger& log) override;
  nlohmann::json technique_savings() const override;
  bool supports_context_parallel() const override { return true; }
  nlohmann::json log_metrics() override { return window_.take(); }

 private:
  // TRL's per-micro-batch entropy and mean_token_accuracy over its label tokens (from the
  // fused loss's row statistics; none where the loss path cannot give them).
  void add_row_stats(const ForwardResult& r);
  MetricWindow window_;
  std::shared_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<DataLoader> train_;
  std::shared_ptr<DataLoader> eval_;
  DataStats train_stats_;
  bool fused_loss_;
  int64_t padded_tokens_avoided_ = 0;
  int64_t max_micro_tokens_ = 0;
  int64_t max_sequence_tokens_ = 0;  // the longest sequence (document) of any micro-batch
};

// Everything `trainer_bin sft` builds before training: model, tokenizer, data, trainer.
struct SftRun {
  SftSetup setup;
  std::shared_ptr<Tokenizer> tokenizer;
  std::shared_ptr<DecoderModel> model;
  std::unique_ptr<SftTrainer> trainer;
  int32_t eos_token_id = 0;
};
// The model side of a run, loaded from the model options alone (sft_model_option_names):
// tokenizer, model, LoRA adapters, quantized base. Empty model_name_or_path: the embedded demo.
struct SftModel {
  SftSetup setup;  // without the dataset
  std::shared_ptr<Tokenizer> tokenizer;
  std::shared_ptr<DecoderModel> model;
  PeftSetup peft;         // shares the adapters with the model (inactive without use_peft)
  std::string base_name;  // base_model_name_or_path for adapter_config.json
  QuantConfig quant;      // enabled(): the base is quantized
  QuantizeReport quant_report;
};
// The sft options that describe the model rather than the training run (the chat group among
// them: the tokenizer and its chat template are loaded with the model).
const std::vector<std::string>& sft_model_option_names();
SftModel load_sft_model(const Options& o);
// base_model_name_or_path for the adapter a run writes: m.base_name, except for the demo with
// use_peft, whose base exists only in memory: it is initialised again from the seed (dense, as
// before any quantization), written to output_dir/base_model with the tokenizer files, and named
// relative to the output folder's parent, as PEFT-style loaders resolve it, so that the adapter
// loads again.
std::string adapter_base_name(const SftModel& m, bool use_peft, const std::string& output_dir,
                              uint64_t seed);
// What an embedder hands a run besides options (public API): the communicator it spans (null:
// the world communicator), and the training rows in memory instead of option dataset (JSONL
// lines, named "dataset_rows" in messages: row i is line i + 1; null: the file).
struct RunInputs {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<const std::vector<std::string>> dataset_rows;
};
// The training rows of a run: in.dataset_rows (refused beside option dataset), else option
// dataset, else the demo's `demo_file` beside the embedded model (a model of one's own needs
// --dataset or rows: Error kInput naming the command).
JsonlSource training_source(const Options& o, const SftModel& m, const RunInputs& in,
                            const std::string& demo_file);
// Builds the run from parsed options (Error(kInput) for any bad option, file or data); the
// second form trains an already loaded model (its model options must be those in `o`).
SftRun make_sft_run(const Options& o);
SftRun make_sft_run(const Options& o, const SftModel& m, const RunInputs& in = {});

// The built-in demo's closing line (TrainRun::demo_sample): "sample: " + a story opening and its
// greedy continuation (48 tokens at most) by the model as trained, adapter dropout off.
std::function<std::string()> sft_demo_sample(const SftModel& m, const std::string& chat_template);

// Where the embedded default run's files live (data/embedded in the source tree, or
// $LEANTUNE_DATA_DIR/embedded).
std::string embedded_data_dir();

}  // namespace leantune
