// DPO's pairwise losses (TRL 1.16 DPOTrainer._compute_loss) as pure
// functions of the per-sequence log-probabilities: values, their gradients with respect to the
// policy's chosen/rejected log-probabilities, and TRL's reward metrics. Float64 on the host;
// the trainer feeds the gradients back into the network (the sequence log-probabilities are the
// only path from the loss to the weights).
//
// With r_w = logp_w - ref_w, r_l likewise, the scores s = f'(exp r) per f_divergence_type:
//   reverse_kl s = r;  forward_kl s = 1 - e^{-r};  js_divergence s = log 2 + log sigmoid(r);
//   alpha_divergence s = (e^{(a-1) r} - 1)/(a-1) with the exponent clamped at 80 (r when a = 1).
// Delta = s_w - s_l, z = beta * Delta, eps = label_smoothing, n = completion tokens (min 1):
//   sigmoid      -log sig(z)                      hinge       relu(1 - z)
//   ipo          (s_w/n_w - s_l/n_l - 1/(2 beta))^2
//   robust       (-(1-eps) log sig(z) + eps log sig(-z)) / (1 - 2 eps)
//   exo_pair     sig(z)(log sig(z) - log(1-eps)) + sig(-z)(log sig(-z) - log eps)
//   nca_pair     -log sig(beta r_w) - log sig(-beta r_w)/2 - log sig(-beta r_l)/2
//   bco_pair     -log sig(beta r_w) - log sig(-beta r_l)
//   sppo_hard    (r_w - 0.5/beta)^2 + (r_l + 0.5/beta)^2
//   apo_zero     1 - sig(beta r_w) + sig(beta r_l)
//   apo_down     sig(beta r_w) + 1 - sig(beta (r_w - r_l))
//   sigmoid_norm -log sig(beta (s_w/n_w - s_l/n_l))
//   sft          -(sum of chosen log-probs) / (chosen completion tokens) for the whole batch
// loss = sum_k w_k mean_pairs(loss_k) (loss_weights default 1 each).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loaders/option_table.h"

namespace leantune {

struct PreferenceLossConfig {
  std::vector<std::string> loss_types = {"sigmoid"};
  std::vector<double> loss_weights;  // empty: 1 per loss type
  double beta = 0.1;
  double label_smoothing = 0.0;
  std::string f_divergence_type = "reverse_kl";
  double f_alpha_divergence_coef = 0.5;  // DPOConfig's default
};

// The loss types implemented, in TRL's order.
const std::vector<std::string>& preference_loss_types();
// Error(kInput) naming the option: unknown loss type, loss_weights count mismatch, beta <= 0,
// label_smoothing outside [0, 0.5) (robust) or (0, 1) (exo_pair), unknown f_divergence_type.
void validate_preference_loss(const PreferenceLossConfig& cfg);

// One micro-batch of pairs. tokens: completion tokens (TRL's completion_mask sum) for ipo and
// sigmoid_norm; loss_tokens: the chosen sequences' scored tokens (sft's denominator).
struct PreferencePairs {
  std::vector<double> chosen_logps, rejected_logps;
  std::vector<double> ref_chosen_logps, ref_rejected_logps;
  std::vector<int64_t> chosen_tokens, rejected_tokens;
  std::vector<int64_t> chosen_loss_tokens;
};

struct PreferenceLossResult {
  double loss = 0;
  std::vector<double> loss_by_type;                      // mean per loss type, unweighted
  std::vector<double> dchosen, drejected;                // d loss / d policy log-probs
  std::vector<double> chosen_rewards, rejected_rewards;  // beta * r
  // TRL's metrics over this batch.
  double rewards_chosen = 0, rewards_rejected = 0, rewards_accuracies = 0, rewards_margins = 0;
  double logps_chosen = 0, logps_rejected = 0;
};

PreferenceLossResult preference_loss(const PreferenceLossConfig& cfg, const PreferencePairs& p);

// Option declarations (TRL DPOConfig names and defaults) and their reading.
const OptionTable<PreferenceLossConfig>& preference_loss_table();
// preference_loss_table().read, validated (validate_preference_loss).
PreferenceLossConfig preference_loss_config(const Options& o);

}  // namespace leantune
