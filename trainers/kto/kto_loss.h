// The KTO loss (Ethayarajh et al. 2024, eq. 7) as TRL's KTOTrainer computes it, on per-sequence
// summed log-probabilities, in float64, with its gradient and TRL's metrics.
//
// Inputs, per example of a micro-batch: the policy's and the reference's summed completion
// log-probabilities, the desirable/undesirable label, and (loss_type kto) the policy's and the
// reference's log-probabilities of the KL sequences: each prompt paired with another example's
// completion (TRL rotates the completions by one within each batch of
// per_device_train_batch_size: KL completion i = completion i-1, the first taking the last).
//   r_i = logp_i - ref_i,   kl = max(0, mean_i(kl_logp_i - ref_kl_logp_i))  (detached)
//   kto:                desirable   w_d (1 - sigmoid(beta (r_i - kl)))
//                       undesirable w_u (1 - sigmoid(beta (kl - r_i)))
//   apo_zero_unpaired:  desirable   w_d (1 - sigmoid(beta r_i)),  undesirable w_u sigmoid(beta r_i)
//                       (no KL sequences)
//   loss = mean over the micro-batch's examples (TRL's nanmean of the concatenated losses).
// Under data parallel TRL averages kl over the ranks (gather_for_metrics(kl).mean()); the caller
// passes the ranks' mean in `kl_override` then.
// Metrics (as TRL logs them): kl; rewards/chosen and rewards/rejected (mean beta r over each
// side), logps/chosen and logps/rejected (mean logp), rewards/margins (when both sides exist),
// logits/chosen and logits/rejected (sum of per-token vocabulary-mean logits over each side's
// completion tokens / its token count).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loaders/option_table.h"

namespace leantune {

struct KtoLossConfig {
  std::string loss_type = "kto";  // kto | apo_zero_unpaired
  double beta = 0.1;
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
};

// loss_type, beta, desirable_weight, undesirable_weight (KTOConfig's names and defaults).
const OptionTable<KtoLossConfig>& kto_loss_table();
KtoLossConfig kto_loss_config(const Options& o);
// Whether the loss needs the KL sequences.
inline bool kto_uses_kl(const KtoLossConfig& c) { return c.loss_type == "kto"; }

struct KtoExampleTerms {
  double logp = 0, ref_logp = 0;
  bool desirable = false;
  int64_t completion_tokens = 0;
  double logit_sum = 0;    // sum over completion tokens of the vocabulary-mean logit
  double entropy_sum = 0;  // sum over completion tokens of the policy's entropy
};

struct KtoLossResult {
  double loss = 0;
  double kl = 0;
  std::vector<double> dlogp;  // d loss / d logp_i (the reference and kl carry no gradient)
  nlohmann::json metrics;
};

// kl_logps / ref_kl_logps: one per example (ignored for apo_zero_unpaired). kl_override: the
// KL estimate to use instead of this batch's (data parallel: the ranks' mean, before clamping).
KtoLossResult kto_loss(const KtoLossConfig& cfg, const std::vector<KtoExampleTerms>& ex,
                       const std::vector<double>& kl_logps, const std::vector<double>& ref_kl_logps,
                       std::optional<double> kl_override = std::nullopt);
// The unclamped batch KL estimate mean(kl_logps - ref_kl_logps) (0 for an empty batch).
double kto_batch_kl(const std::vector<double>& kl_logps, const std::vector<double>& ref_kl_logps);

}  // namespace leantune
