// Reward modelling on TRL-format preference JSONL (trainer_bin reward), with TRL RewardConfig's
// option names and defaults (learning_rate 1e-4, max_length 1024, center_rewards_coefficient
// none, disable_dropout, gradient_checkpointing on).
//
// Model: the decoder with a sequence-classification head (models/score_head.h): an HF
// *ForSequenceClassification folder, or a causal-LM folder turned into one with a fresh `score`
// (as TRL loads AutoModelForSequenceClassification with num_labels=1); its pad_token_id is set to
// the tokenizer's pad token (else eos), as RewardTrainer sets it. The output folder is an HF
// Qwen2ForSequenceClassification / LlamaForSequenceClassification. With use_peft, `score` is in
// modules_to_save (trained whole, saved in the adapter under base_model.model.score.weight) and
// the adapter's task_type is SEQ_CLS, as PEFT does for sequence classification.
//
// Data: loaders/examples.h load_reward_data (each side tokenized whole; pairs longer than
// max_length dropped and counted; an optional margin column). A micro-batch of
// per_device_train_batch_size pairs is one flat Batch of 2B sequences [all chosen; all
// rejected], right-padded to the longest (pad_to_multiple_of) as TRL's DataCollatorForPreference
// pads, or flat without pad tokens under padding_free (the scores are the same: causal attention
// never lets a real token see the padding after it).
// Loss (RewardTrainer.compute_loss), per micro-batch of n pairs with scores r_c, r_r:
//   mean_i -log sigmoid(r_c,i - r_r,i - margin_i)  +  c * mean_i (r_c,i + r_r,i)^2
// (c = center_rewards_coefficient); in float64 on the host from the scores, its gradient passed
// back through them. The accumulated batch's loss is each micro-batch's mean times its share of
// the accumulated pairs.
// Metrics (metrics.jsonl and the progress line), averaged over the logging window's micro-batches
// as TRL averages them: accuracy (mean [r_c > r_r]), margin (mean r_c - r_r), min_reward,
// mean_reward, max_reward (over both sides).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loaders/examples.h"
#include "loaders/tokenizer.h"
#include "models/peft_io.h"
#include "models/quantize_model.h"
#include "models/score_head.h"
#include "trainers/common/model_source.h"
#include "trainers/common/row_batch_trainer.h"
#include "trainers/common/trainer.h"

namespace leantune {

// reward's own options (TRL's RewardConfig names and defaults); its table also declares the
// dataset, chat, PEFT, quantization and training groups, in --help order.
struct RewardArguments : ModelSource {
  std::optional<int64_t> max_length = 1024;  // none: no limit
  std::optional<int64_t> pad_to_multiple_of;
  bool padding_free = false;
  double center_rewards_coefficient = 0.0;  // 0: off (TRL's None)
  bool disable_dropout = true;
};
const OptionTable<RewardArguments>& reward_table();
// The reward command's options; `command` names the usage line (estimate reuses them).
Options reward_options(const std::string& command = "reward");

struct RewardCollateConfig {
  bool padding_free = false;
  int64_t pad_to_multiple_of = 0;
  int32_t pad_token_id = 0;
};

// Pairs `idx` as one Batch [chosen of idx...; rejected of idx...] and their margins.
struct RewardBatch {
  Batch batch;
  std::vector<double> margins;  // one per pair (0 without a margin column)
  int64_t pairs() const { return static_cast<int64_t>(margins.size()); }
};
RewardBatch collate_reward_pairs(const std::vector<RewardPair>& data,
                                 const std::vector<int64_t>& idx, const RewardCollateConfig& cfg);

struct RewardLossResult {
  double loss = 0;
  std::vector<double> dchosen, drejected;  // d loss / d score
  nlohmann::json metrics;                  // accuracy, margin, min/mean/max_reward
};
// chosen/rejected: the pairs' scores; margins empty or one per pair; center: the coefficient
// (0 = off).
RewardLossResult reward_loss(const std::vector<double>& chosen, const std::vector<double>& rejected,
                             const std::vector<double>& margins, double center);

class RewardTrainer final : public RowBatchTrainer<RewardBatch, RewardData> {
 public:
  RewardTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
                std::string tokenizer_dir, RewardData train, std::optional<RewardData> eval,
                RewardCollateConfig collate, double center_rewards_coefficient,
                bool disable_dropout);

  const DataStats& train_stats() const override { return train_.stats; }
  // The loss of one collated micro-batch times `scale`, differentiable with respect to the
  // model; the loss terms and metrics go to *result when given.
  Tensor pairs_loss(const RewardBatch& rb, double scale, RewardLossResult* result);

 protected:
  Batch next_micro_batch(BatchReport* report) override;
  int64_t loss_tokens(const Batch& b) const override { return b.stats.sequences / 2; }
  Tensor compute_loss(const Batch& b, double normalizer) override;
  std::optional<nlohmann::json> evaluate() override;
  void on_train_begin(MetricsLogger& log) override;
  nlohmann::json technique_savings() const override;

 private:
  RewardData train_;
  RewardCollateConfig collate_;
  double center_;
  bool disable_dropout_;
};

// The model side of a reward run, from the model options (model_name_or_path, device, bf16, the
// chat, PEFT and quantization options): tokenizer, classifier, adapters.
struct RewardModelSetup {
  std::string model_name_or_path;  // empty: the built-in demo model
  std::string tokenizer_dir;
  bool embedded = false;
  bool converted = false;  // a causal LM given a fresh score head
  std::shared_ptr<Tokenizer> tokenizer;
  std::shared_ptr<DecoderModel> model;
  PeftSetup peft;
  std::string base_name;  // base_model_name_or_path for adapter_config.json
  QuantConfig quant;
  QuantizeReport quant_report;
};
RewardModelSetup load_reward_model(const Options& o);

struct RewardRun {
  RewardModelSetup model;
  std::unique_ptr<RewardTrainer> trainer;
};
// Loads model and data per the options (Error(kInput) for any bad option or data).
RewardRun make_reward_run(const Options& o);

// A trained reward model: an HF *ForSequenceClassification folder, or a PEFT adapter folder of
// one (task_type SEQ_CLS; its base from base_model_name_or_path, a causal LM given the adapter's
// score head). A model without pad_token_id gets `pad_token_id` when given (the reward trainer
// used the tokenizer's). Error(kInput) naming the folder otherwise.
RewardModel open_reward_model(const std::string& path, Device device, DType dtype,
                              std::optional<int64_t> pad_token_id = std::nullopt);

}  // namespace leantune
