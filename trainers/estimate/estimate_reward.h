// Memory estimate of a reward run (trainer_bin estimate reward [the reward options]): the SFT
// walk of trainers/estimate/estimate.h over a micro-batch of per_device_train_batch_size pairs,
// i.e. 2 x per_device_train_batch_size x max_length tokens (chosen and rejected), on the model as a
// sequence classifier: the score head [1, H] instead of the LM head, always trained (in
// modules_to_save under PEFT), and no vocabulary-wide loss (the score rows only).
#pragma once

#include <string>
#include <vector>

#include "loaders/options.h"
#include "trainers/estimate/estimate.h"

namespace leantune {

// From parsed reward options (trainers/reward/reward.h reward_options); `model` is converted to a
// sequence classifier when it is a causal LM.
EstimateConfig reward_estimate_config(const Options& o, const ModelConfig& model, bool cpu);
int run_estimate_reward(const std::vector<std::string>& args);

}  // namespace leantune
