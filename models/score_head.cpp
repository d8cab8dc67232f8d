// Sequence-classification scores, the classifier loader and RewardModel. Contract in
// score_head.h.
#include "models/score_head.h"

#include <algorithm>
#include <unordered_set>

#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "engine/offload.h"
#include "engine/rng.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "loaders/host_batch.h"
#include "loaders/model_config.h"
#include "loaders/safetensors.h"
#include "models/peft_io.h"

namespace leantune {

std::vector<int64_t> score_rows(const Batch& batch, std::optional<int64_t> pad_token_id) {
  const std::vector<int64_t> ids = batch.input_ids.to_i64();
  const std::vector<int64_t> cu = batch.cu_seqlens.to_i64();
  std::vector<int64_t> rows;
  rows.reserve(cu.size() > 0 ? cu.size() - 1 : 0);
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t begin = cu[b], end = cu[b + 1];
    LT_CHECK(end > begin, "score_rows: sequence ", b, " is empty");
    int64_t row = end - 1;
    if (pad_token_id) {
      row = begin;  // all pad: argmax of a zero mask
      for (int64_t t = end - 1; t >= begin; --t)
        if (ids[static_cast<size_t>(t)] != *pad_token_id) {
          row = t;
          break;
        }
    }
    rows.push_back(row);
  }
  return rows;
}

Tensor sequence_scores(const DecoderModel& model, const Batch& batch, bool gradient_checkpointing) {
  LT_CHECK(model.config().sequence_classification && model.score_weight().defined(),
           "sequence_scores: the model has no score head (", model.config().architecture, ")");
  LT_CHECK(batch.input_ids.defined() && batch.cu_seqlens.defined(), "scores of an empty batch");
  const MemPhase outer = current_mem_phase();
  MemPhaseGuard phase(outer.kind == MemPhaseKind::kNone ? MemPhase{MemPhaseKind::kForward} : outer);
  const Device dev = model.device();
  Tensor hidden =
      model.hidden_states(batch.input_ids.to(dev), batch.position_ids.to(dev),
                          batch.cu_seqlens.to(dev), seq_hints(batch), gradient_checkpointing);
  // The head stays on the device under activation offloading, as the LM head does.
  NoOffloadScope head;
  const std::vector<int64_t> rows = score_rows(batch, model.config().pad_token_id);
  const Tensor idx = Tensor::from_vector(rows, {static_cast<int64_t>(rows.size())}).to(dev);
  return kernels::linear(kernels::embedding(hidden, idx), model.score_weight());
}

std::shared_ptr<DecoderModel> load_sequence_classifier(const std::string& dir, Device device,
                                                       DType dtype, uint64_t seed,
                                                       std::optional<int64_t> num_labels,
                                                       SequenceClassifierLoad* report) {
  ModelConfig cfg = ModelConfig::load(dir);
  const bool convert = !cfg.sequence_classification;
  if (convert) {
    cfg = cfg.as_sequence_classification(num_labels.value_or(1));
  } else {
    LT_CHECK_INPUT(!num_labels || cfg.num_labels == *num_labels, dir,
                   "/config.json: ", cfg.architecture, " with num_labels ", cfg.num_labels,
                   "; a reward model has ", num_labels.value_or(0), " (id2label with one entry)");
  }
  auto model = std::make_shared<DecoderModel>(cfg, device, dtype);
  std::unordered_set<std::string> optional;
  if (convert) optional.insert("score.weight");
  const std::vector<std::string> skipped = model->load_weights(TensorStore::open(dir), optional);
  if (!skipped.empty()) {
    NoGradGuard ng;
    Generator gen(seed, RngPurpose::kInit);
    normal_(model->score_weight(), gen, 0.0, cfg.initializer_range);
  }
  if (report) report->converted_from_causal_lm = !skipped.empty();
  return model;
}

RewardModel::RewardModel(std::shared_ptr<DecoderModel> model, std::shared_ptr<PeftSetup> adapters)
    : model_(std::move(model)), adapters_(std::move(adapters)) {
  if (adapters_) adapters_->set_training(false);
  LT_CHECK_INPUT(model_->config().sequence_classification && model_->config().num_labels == 1,
                 "a reward model is a *ForSequenceClassification with num_labels 1, not ",
                 model_->config().architecture);
}

RewardModel RewardModel::load(const std::string& dir, Device device, DType dtype) {
  const ModelConfig cfg = ModelConfig::load(dir);
  LT_CHECK_INPUT(cfg.sequence_classification, dir, "/config.json: ", cfg.architecture,
                 " is not a reward model (expected LlamaForSequenceClassification or "
                 "Qwen2ForSequenceClassification, as trainer_bin reward writes)");
  return RewardModel(load_sequence_classifier(dir, device, dtype, 0, 1));
}

std::vector<double> RewardModel::score(const Batch& batch) const {
  NoGradGuard ng;
  MemPhaseGuard phase(MemPhase{MemPhaseKind::kEvaluation});
  return sequence_scores(*model_, batch).to(Device::cpu(), DType::kF64, MemTag::kOther).to_f64();
}

std::vector<double> RewardModel::score_sequences(
    const std::vector<std::vector<int32_t>>& ids) const {
  return score(sequences_batch(ids, 0, true, 0));
}

Batch sequences_batch(const std::vector<std::vector<int32_t>>& seqs, int64_t pad_to_multiple_of,
                      bool padding_free, int32_t pad_id) {
  LT_CHECK(!seqs.empty(), "sequences_batch: no sequence");
  int64_t longest = 0;
  for (const auto& s : seqs) longest = std::max<int64_t>(longest, static_cast<int64_t>(s.size()));
  int64_t padded = longest;
  if (pad_to_multiple_of > 0)
    padded = (longest + pad_to_multiple_of - 1) / pad_to_multiple_of * pad_to_multiple_of;
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu{0};
  BatchStats st;
  for (const auto& s : seqs) {
    const int64_t n = static_cast<int64_t>(s.size());
    LT_CHECK(n > 0, "sequences_batch: an empty sequence");
    const int64_t len = padding_free ? n : padded;
    for (int64_t t = 0; t < len; ++t) {
      ids.push_back(t < n ? s[static_cast<size_t>(t)] : pad_id);
      pos.push_back(t);
      labels.push_back(kernels::kIgnoreIndex);
    }
    st.real_tokens += n;
    st.pad_tokens += len - n;
    cu.push_back(cu.back() + static_cast<int32_t>(len));
  }
  st.sequences = static_cast<int64_t>(seqs.size());
  return host_batch(ids, pos, labels, cu, padding_free ? longest : padded, st);
}

}  // namespace leantune
