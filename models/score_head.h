// Sequence classification on the decoder (transformers' Qwen2ForSequenceClassification /
// LlamaForSequenceClassification, TRL's reward models): the final-normed hidden state of one
// token per sequence times the head `score.weight` [num_labels, H] (no bias).
//
// Which token (score_rows), per sequence of a flat varlen Batch (loaders/batch.h), as
// transformers' GenericForSequenceClassification reads it:
//   - with config.pad_token_id: the rightmost position whose token is not the pad id (left and
//     right padding alike). A sequence whose last real tokens equal the pad id (eos used as
//     pad) is read before them; a sequence that is all pad reads its first position (argmax of
//     an all-zero mask is 0).
//   - without pad_token_id: the sequence's last position. transformers refuses batches of more
//     than one row then, since it cannot tell where padded rows end; a varlen batch knows every
//     sequence's end, so each sequence is read as it would be alone.
//
// sequence_scores: [B, num_labels] in the model's dtype, differentiable with respect to the
// decoder and the head: the rows are gathered from the hidden states by kernels::embedding
// (whose backward scatters the gradient back into those rows) and go through kernels::linear.
// The hidden states of every row are computed (the decoder is causal, so each read row needs
// its prefix anyway); nothing of [T, V] size exists.
//
// load_sequence_classifier: an HF *ForSequenceClassification folder as it is, or a causal-LM
// folder turned into one (as TRL's RewardTrainer loads AutoModelForSequenceClassification with
// num_labels=1): the LM head is left unread and `score.weight` is drawn from
// Normal(0, initializer_range) with the Philox stream (seed, kInit), as transformers'
// _init_weights draws it from torch's generator.
//
// RewardModel: a loaded classifier with num_labels 1, for the trainers that score completions
// (GRPO's reward model): score(batch) or score_sequences(ids) -> one reward per sequence, under
// no-grad (adapter dropout off). trainers/reward/reward.h open_reward_model also opens PEFT adapter
// folders.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loaders/batch.h"
#include "models/decoder.h"

namespace leantune {

// The flat row each sequence's score is read at (see above).
std::vector<int64_t> score_rows(const Batch& batch, std::optional<int64_t> pad_token_id);

// [B, num_labels] scores of the batch's sequences (model: config().sequence_classification).
Tensor sequence_scores(const DecoderModel& model, const Batch& batch,
                       bool gradient_checkpointing = false);

struct SequenceClassifierLoad {
  bool converted_from_causal_lm = false;  // score.weight was initialised, not read
};

// Error(kInput) naming the folder for anything that is neither a Llama/Qwen2 causal LM nor its
// sequence classifier, or (for a classifier folder) num_labels other than `num_labels` when that
// is given.
std::shared_ptr<DecoderModel> load_sequence_classifier(const std::string& dir, Device device,
                                                       DType dtype, uint64_t seed,
                                                       std::optional<int64_t> num_labels,
                                                       SequenceClassifierLoad* report = nullptr);

struct PeftSetup;

class RewardModel {
 public:
  // adapters: the LoRA setup attached to `model` (kept alive with it), or null.
  explicit RewardModel(std::shared_ptr<DecoderModel> model,
                       std::shared_ptr<PeftSetup> adapters = nullptr);
  // A reward model folder (an HF *ForSequenceClassification with num_labels 1).
  static RewardModel load(const std::string& dir, Device device, DType dtype);

  // One reward per sequence of the batch (no gradient).
  std::vector<double> score(const Batch& batch) const;
  // The sequences as one flat varlen batch, without padding.
  std::vector<double> score_sequences(const std::vector<std::vector<int32_t>>& ids) const;
  DecoderModel& model() const { return *model_; }

 private:
  std::shared_ptr<DecoderModel> model_;
  std::shared_ptr<PeftSetup> adapters_;
};

// A flat varlen Batch of the sequences: unless padding_free, each right-padded with pad_id to the
// longest (rounded up to a multiple of pad_to_multiple_of when > 0), as TRL's collator pads;
// labels all ignored; stats count real and pad tokens. Host tensors.
Batch sequences_batch(const std::vector<std::vector<int32_t>>& ids, int64_t pad_to_multiple_of,
                      bool padding_free, int32_t pad_id);

}  // namespace leantune
