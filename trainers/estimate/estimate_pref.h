// Memory estimate of a preference run (trainer_bin estimate dpo|kto ...): the policy's step as
// the SFT estimate walks it (trainers/estimate/estimate.h) over the micro-batch's chosen AND
// rejected sequences (2 x per_device_train_batch_size x max_length tokens; kto: its matched
// sequences, 1 x ..., the KL sequences being scored without gradient), plus what each reference
// mode keeps resident for the whole run:
//   precomputed   no weights; 16 B per cached sequence (host)
//   adapters_off  nothing: the reference is the policy's base with the adapters off
//   policy_copy   a second dense copy of the weights
//   ref_model     the --ref_model's weights (its config.json when present, else the policy's
//                 shape), NF4 with ref_load_in_4bit
// The reference forward runs under no-grad before the policy's and frees its activations layer
// by layer, below the policy's own peak, so it adds nothing at the peak.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loaders/options.h"
#include "trainers/estimate/estimate.h"

namespace leantune {

struct PreferenceEstimate {
  MemoryEstimate policy;
  std::string reference_mode;  // ref_mode_name()
  int64_t reference_params = 0;
  int64_t peak = 0;
  nlohmann::json to_json() const;  // the policy estimate with the reference added to params/peak
};

// Reference weights for a mode; ref_model_config: the --ref_model's config (may equal policy's).
int64_t reference_param_bytes(const std::string& mode, const ModelConfig& policy,
                              const ModelConfig& ref_model_config, bool bf16, bool ref_4bit,
                              bool ref_8bit = false);
PreferenceEstimate estimate_preference(const EstimateConfig& policy, const std::string& mode,
                                       int64_t reference_params);
// From parsed dpo options (trainers/dpo/dpo.h dpo_options).
PreferenceEstimate estimate_dpo_from_options(const Options& o, const ModelConfig& model, bool cpu);
// From parsed dpo or kto options: sequences_per_example is 2 for dpo (chosen and rejected), 1
// for kto (the matched sequence; its KL sequence runs without gradient).
PreferenceEstimate estimate_preference_from_options(const Options& o, const ModelConfig& model,
                                                    bool cpu, int64_t sequences_per_example);

// trainer_bin estimate dpo|kto [that trainer's options]: the estimate of each reference mode.
int run_estimate_dpo(const std::vector<std::string>& args);
int run_estimate_preference(const std::vector<std::string>& args, const std::string& trainer);

}  // namespace leantune
