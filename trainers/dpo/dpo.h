// DPO: direct preference optimisation on TRL-format preference JSONL (trainer_bin dpo), with
// TRL DPOConfig's option names and defaults.
//
// Data: loaders/examples.h load_preference_data (explicit or implicit prompt, standard or
// conversational through the chat template; max_prompt_length keeps the prompt's last tokens and
// max_completion_length the completions' first, both none by default and applied first; then
// max_length with truncation_mode over prompt + completion; every truncated or dropped pair
// counted in the data report). A micro-batch of per_device_train_batch_size pairs is one flat
// Batch of 2B sequences laid out [all chosen; all rejected] as TRL's collator does, labels = the
// completion tokens. padding_free: each sequence keeps its own length; otherwise every sequence
// is right-padded to the batch's longest (pad_to_multiple_of) with pad tokens that carry no
// label, which leaves every log-probability unchanged under causal attention.
// Loss: per-sequence summed log-probabilities of the policy (differentiable) and the reference
// (models/ref_model.h), then trainers/dpo/preference_loss.h; a micro-batch's loss is its pair mean
// times its share of the accumulated batch's pairs. use_liger_loss: the chunked LM head
// (kernels/sequence_logprobs.h), the [tokens x vocab] logits never exist.
// Metrics (metrics.jsonl and the progress line): rewards/chosen, rewards/rejected,
// rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, logits/chosen,
// logits/rejected, entropy, mean_token_accuracy, averaged over the logging window's micro-batches
// as TRL averages them.
// Context parallelism (--cp_size, dist/context_parallel.h): the ranks of a cp group share
// each micro-batch and score their zigzag rows of it through the ring; the per-sequence partial
// sums are summed over the group (cp_sum), so every rank computes the single-process loss and
// metrics, and only cp rank 0 counts the pairs in the world-wide normaliser and loss sum. The
// reference scores the same rows through the ring (unless precomputed), without grad.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dist/context_parallel.h"
#include "loaders/examples.h"
#include "loaders/tokenizer.h"
#include "models/ref_model.h"
#include "trainers/common/row_batch_trainer.h"
#include "trainers/common/trainer.h"
#include "trainers/dpo/preference_loss.h"
#include "trainers/sft/sft.h"

namespace leantune {

// dpo's own options (TRL's DPOConfig names and defaults); its table also declares the loss,
// reference-model, dataset, chat, PEFT, quantization and training groups, in --help order.
struct DpoArguments : ModelSource, ScoredSequences {
  std::optional<int64_t> max_prompt_length;
  std::optional<int64_t> max_completion_length;
  bool padding_free = false;
  std::optional<int64_t> pad_to_multiple_of;
};
const OptionTable<DpoArguments>& dpo_table();
// The dpo command's options; `command` names the usage line (estimate reuses them).
Options dpo_options(const std::string& command = "dpo");

struct DpoDataConfig {
  int64_t max_length = 1024;  // 0 = none
  std::string truncation_mode = "keep_start";
  bool padding_free = false;
  int64_t pad_to_multiple_of = 0;
  int32_t pad_token_id = 0;
};

// The sequences of pairs `idx` as one Batch: [chosen of idx...; rejected of idx...].
// tokens/completion: per sequence, completion tokens kept after max_length.
struct PairBatch {
  Batch batch;
  std::vector<int64_t> keys;  // 2 * example + {0 chosen, 1 rejected}
  std::vector<int64_t> completion_tokens;
};
PairBatch collate_pairs(const std::vector<PreferenceExample>& data, const std::vector<int64_t>& idx,
                        const DpoDataConfig& cfg);

class DpoTrainer final : public RowBatchTrainer<PairBatch, PreferenceData> {
 public:
  DpoTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
             std::string tokenizer_dir, PreferenceData train, DpoDataConfig data,
             PreferenceLossConfig loss, SequenceLogpsOptions logps);

  // The reference model, after set_peft.
  void set_reference(RefModelConfig cfg);
  ReferenceModel& reference() { return *ref_; }
  const DataStats& train_stats() const override { return train_.stats; }
  // Every logged record's DPO metrics, in order (for tests and the command's summary).
  // Loss and metrics of the given pairs with the current weights (no update, no dropout).
  PreferenceLossResult evaluate_pairs(const std::vector<int64_t>& idx);
  // The loss of one collated micro-batch times `scale`, differentiable with respect to the
  // policy; the loss terms go to *result and TRL's metrics to *metrics when given.
  Tensor pairs_loss(const PairBatch& pb, double scale, PreferenceLossResult* result,
                    nlohmann::json* metrics);

 protected:
  Batch next_micro_batch(BatchReport* report) override;
  int64_t loss_tokens(const Batch& b) const override;
  bool supports_context_parallel() const override { return true; }
  Tensor compute_loss(const Batch& b, double normalizer) override;
  // TRL's DPO metrics (as in training) and the mean loss over the evaluation pairs.
  std::optional<nlohmann::json> evaluate() override;
  void on_train_begin(MetricsLogger& log) override;
  nlohmann::json technique_savings() const override;

 private:
  // Evaluation pairs idx collated, their reference keys after the training pairs'.
  PairBatch collate_eval(const std::vector<int64_t>& idx) const;
  PreferenceData train_;
  DpoDataConfig data_;
  PreferenceLossConfig loss_;
  SequenceLogpsOptions logps_;
};

struct DpoRun {
  SftModel model;
  std::unique_ptr<DpoTrainer> trainer;
};
// Loads model, data and reference per the options (Error(kInput) for any bad option or data).
// The second form trains an already loaded model (its model options, sft_model_option_names,
// must be those in `o`) on the inputs an embedder gives (public API).
DpoRun make_dpo_run(const Options& o);
DpoRun make_dpo_run(const Options& o, SftModel model, const RunInputs& in = {});
// Refuses bad training, reference and loss options before anything loads.
void check_dpo_options(const Options& o);

}  // namespace leantune
