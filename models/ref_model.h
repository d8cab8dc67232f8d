// The frozen reference model of the preference and RL trainers (dpo, kto, grpo, rloo,
// online_dpo), and the per-sequence log-probabilities they all need.
//
// sequence_logps(model, batch, opts): one forward of a flat varlen Batch (loaders/batch.h; the
// labels are the tokens to score, -100 elsewhere, shifted inside as the LM loss is) ->
// kernels::SequenceLogprobs: logps [B] (differentiable when grad mode is on and the model has
// trainable parameters), counted tokens per sequence, and optionally the sum of vocabulary-mean
// logits (TRL's logits/* metrics). With fused (use_liger_loss) the chunked LM head is used and
// the [T, V] logits never exist; without it the full logits are formed (the plain path).
//
// The ways to get reference log-probabilities (those of TRL's DPOTrainer), options declared once
// by add_ref_model_options:
//   precompute_ref_log_probs   one no-grad pass over the training data before the first step;
//                              the results are cached per sequence key and nothing is kept of
//                              the reference model during training (a --ref_model is loaded for
//                              the pass and freed after it).
//   use_peft, no ref_model     the policy's own weights with the adapters (and trainable tokens)
//                              switched off for the reference forward: no second copy of the
//                              base; works on a quantized (QLoRA) base.
//   adapter folder, no ref_model  (training goes on from a PEFT adapter) the adapter's initial
//                              values are kept and swapped in for the reference forward, as TRL
//                              copies the loaded adapter to "ref": the reference is base + the
//                              adapter as loaded (adapter dropout off there).
//   --ref_model DIR            a second frozen model from DIR, dense or NF4 (ref_load_in_4bit).
//   otherwise                  (full fine-tuning, no ref_model) a frozen copy of the policy's
//                              initial weights, as TRL loads a second copy of the model.
// The reference forward runs under no-grad without gradient checkpointing.
//
// Sequence keys are the caller's (DPO: 2 * example + {0 chosen, 1 rejected}); the cache is only
// used in the precompute mode.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/sequence_logprobs.h"
#include "loaders/batch.h"
#include "loaders/option_table.h"
#include "models/decoder.h"
#include "models/peft_io.h"
#include "models/quantize_model.h"

namespace leantune {

struct SequenceLogpsOptions {
  bool fused = true;  // use_liger_loss
  int64_t chunk_tokens = 1024;
  bool gradient_checkpointing = false;
  bool logit_sums = false;
  bool row_stats = false;  // entropy and top-1 per sequence (kernels/sequence_logprobs.h)
  // One log-probability per row of the batch instead of per sequence (logps:[T]; row t scores
  // the token at t + 1, 0 where that is not counted), for GRPO's token-level loss.
  bool per_token = false;
  // The logits are divided by this before the log-softmax (GRPO and RLOO score the tokens
  // under the sampling temperature, as TRL does).
  double temperature = 1.0;
  // Set: the batch is this rank's zigzag rows of a context-parallel group (split_context_parallel:
  // its labels are the targets already, its cu_seqlens delimit each sequence's local rows),
  // attention runs the ring, and each sequence's sums are this rank's part (trainers sum them
  // over the group). Not with per_token.
  std::shared_ptr<const ContextParallel> context_parallel;
};

kernels::SequenceLogprobs sequence_logps(const DecoderModel& model, const Batch& batch,
                                         const SequenceLogpsOptions& opts);

// A scalar loss computed on the host from per-sequence log-probabilities: its value is `value`
// and its gradient with respect to `logps` ([n], from sequence_logps) is `grad` times the
// incoming gradient. The preference losses (trainers/dpo/preference_loss.h, KTO's) are host
// functions of these few numbers, so their backward is the precomputed gradient.
Tensor loss_from_sequence_gradient(const Tensor& logps, double value, std::vector<double> grad);

// ref_model, ref_load_in_4bit, precompute_ref_log_probs, precompute_ref_batch_size.
void add_ref_model_options(Options& o);

enum class RefMode { kPrecomputed, kAdaptersOff, kInitialAdapter, kSeparateModel, kPolicyCopy };
const char* ref_mode_name(RefMode m);

struct RefModelConfig {
  std::string ref_model;  // empty: none
  bool ref_load_in_4bit = false;
  bool precompute = false;
  std::optional<int64_t> precompute_batch_size;  // none: per_device_eval_batch_size
  // The policy's adapters were loaded from an adapter folder (not freshly initialised): the
  // reference is the adapter as loaded rather than the bare base.
  bool adapter_loaded = false;
};
// The options above (precompute_batch_size none there).
const OptionTable<RefModelConfig>& ref_model_table();
// ref_model_table().read with precompute_batch_size resolved; Error(kInput) naming the option for
// ref_load_in_4bit without ref_model, or a ref_model that is not a folder.
RefModelConfig ref_model_config(const Options& o, int64_t per_device_eval_batch_size);

class ReferenceModel {
 public:
  // policy: the model being trained (its weights as they are now are the reference in the
  // adapters-off and policy-copy modes); peft: its adapters (inactive for full fine-tuning).
  ReferenceModel(RefModelConfig cfg, std::shared_ptr<DecoderModel> policy, PeftSetup* peft);
  ReferenceModel(const ReferenceModel&) = delete;
  ReferenceModel& operator=(const ReferenceModel&) = delete;

  RefMode mode() const { return mode_; }
  // The mode the precompute pass itself uses (equal to mode() unless precomputing).
  RefMode source_mode() const { return source_; }

  // Reference log-probabilities of the batch's sequences (no grad). In the precompute mode the
  // keys are looked up (Error naming the key when missing); elsewhere they are ignored.
  std::vector<double> logps(const Batch& b, const std::vector<int64_t>& keys,
                            const SequenceLogpsOptions& opts);

  // Precompute mode: runs make(i) for i in [0, num_batches) -> {batch, one key per sequence},
  // caches the results and frees whatever reference model the pass needed. No-op elsewhere.
  void precompute(int64_t num_batches,
                  const std::function<std::pair<Batch, std::vector<int64_t>>(int64_t)>& make,
                  const SequenceLogpsOptions& opts);
  bool precomputed() const { return done_; }

  // Bytes of weights the reference holds now beyond the policy's (0 for adapters-off and after
  // precompute), and its entry for the memory report.
  int64_t held_bytes() const;
  nlohmann::json memory_json() const;

 private:
  std::vector<double> forward(const Batch& b, const SequenceLogpsOptions& opts);

  RefModelConfig cfg_;
  RefMode mode_, source_;
  std::shared_ptr<DecoderModel> policy_;
  PeftSetup* peft_;
  std::shared_ptr<DecoderModel> ref_;  // separate model or policy copy, while held
  // kInitialAdapter: (live trainable tensor, its values when training began).
  std::vector<std::pair<Tensor, Tensor>> initial_adapter_;
  QuantizeReport quant_report_;
  int64_t ref_bytes_loaded_ = 0;  // what the separate model / copy held while it existed
  std::unordered_map<int64_t, double> cache_;
  bool done_ = false;
};

// One line for the memory report (format_memory_report prints it when present).
std::string format_reference_memory(const nlohmann::json& ref);

}  // namespace leantune
