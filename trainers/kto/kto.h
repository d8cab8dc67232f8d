// KTO: Kahneman-Tversky optimisation on TRL-format unpaired preference JSONL (trainer_bin kto),
// with TRL KTOConfig's option names and defaults (learning_rate 1e-6, beta 0.1, desirable and
// undesirable weights 1, loss_type kto).
//
// Data: loaders/examples.h load_unpaired_data (prompt, completion, label; standard or
// conversational through the chat template; max_length with truncation_mode; truncated and
// dropped rows counted). Examples are taken in file order, as TRL requires sequential sampling
// for the KL term: micro-batch g holds examples [g*B, (g+1)*B) (B = per_device_train_batch_size);
// under data parallel rank r takes the micro-batches g with g % world_size == r.
// KL sequences: each prompt with the completion of the example before it in the same
// micro-batch (the first takes the last), TRL's rotation within batches of B.
// One micro-batch is two flat varlen batches (no padding): the matched sequences, whose
// summed completion log-probabilities train, and the KL sequences, scored without gradient.
// Loss and metrics: trainers/kto/kto_loss.h; a micro-batch's loss is its example mean times its
// share of the accumulated batch's examples. Under data parallel the KL estimate is the ranks'
// mean, as TRL gathers it. The reference model: models/ref_model.h (the same options as dpo).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loaders/examples.h"
#include "models/ref_model.h"
#include "trainers/common/row_batch_trainer.h"
#include "trainers/common/trainer.h"
#include "trainers/kto/kto_loss.h"
#include "trainers/sft/sft.h"

namespace leantune {

// kto's own options (TRL's KTOConfig names and defaults); its table also declares the loss,
// reference-model, dataset, chat, PEFT, quantization and training groups, in --help order.
struct KtoArguments : ModelSource, ScoredSequences {};
const OptionTable<KtoArguments>& kto_table();
Options kto_options(const std::string& command = "kto");

// The matched and KL sequences of examples `idx` (one micro-batch, in order). Keys: 2 * example
// (matched) and 2 * example + 1 (its KL sequence).
struct UnpairedBatch {
  Batch matched, kl;
  std::vector<int64_t> idx, matched_keys, kl_keys;
  std::vector<bool> labels;  // per example: desirable
};
UnpairedBatch collate_unpaired(const std::vector<UnpairedExample>& data,
                               const std::vector<int64_t>& idx, int64_t max_length,
                               const std::string& truncation_mode, bool with_kl);

class KtoTrainer final : public RowBatchTrainer<UnpairedBatch, UnpairedData> {
 public:
  KtoTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
             std::string tokenizer_dir, UnpairedData train, int64_t max_length,
             std::string truncation_mode, KtoLossConfig loss, SequenceLogpsOptions logps);

  void set_reference(RefModelConfig cfg);
  const DataStats& train_stats() const override { return train_.stats; }
  // The loss of one micro-batch times `scale`, differentiable with respect to the policy.
  Tensor batch_loss(const UnpairedBatch& ub, double scale, KtoLossResult* result);

 protected:
  Batch next_micro_batch(BatchReport* report) override;
  int64_t loss_tokens(const Batch& b) const override;
  bool supports_context_parallel() const override { return true; }
  Tensor compute_loss(const Batch& b, double normalizer) override;
  // TRL's KTO metrics (as in training) and the mean loss over the evaluation examples, in
  // batches of per_device_eval_batch_size (each its own KL estimate).
  std::optional<nlohmann::json> evaluate() override;
  void on_train_begin(MetricsLogger& log) override;
  nlohmann::json technique_savings() const override;

 private:
  // Evaluation examples idx collated, their reference keys after the training examples'.
  UnpairedBatch collate_eval(const std::vector<int64_t>& idx) const;
  UnpairedData train_;
  int64_t max_length_;
  std::string truncation_mode_;
  KtoLossConfig loss_;
  SequenceLogpsOptions logps_;
};

struct KtoRun {
  SftModel model;
  std::unique_ptr<KtoTrainer> trainer;
};
// Loads model, data and reference per the options; with `model` given, trains that already
// loaded model (its model options, sft_model_option_names, must be those in `o`) on the
// inputs an embedder gives (public API).
KtoRun make_kto_run(const Options& o, std::optional<SftModel> model = std::nullopt,
                    const RunInputs& in = {});

}  // namespace leantune
