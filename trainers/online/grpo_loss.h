// The losses of the online trainers grpo and rloo (online_dpo's DPO loss is in grpo.cpp) computed
// on the host from per-token log-probabilities, with their gradient with respect to each token's
// policy log-probability, as TRL 1.16 computes them:
//
// Advantages (GRPOTrainer._generate_and_score_completions, sum_then_normalize), rewards of B =
// prompts x G completions in group-major order:
//   A = r - mean_group(r), divided by (std + 1e-4) unless scale_rewards is "none"; std is the
//   group's ("group") or the whole batch's ("batch") with Bessel's correction, both NaN-aware. A
//   NaN reward (every reward function declined) stays out of the means and gets advantage 0.
// RLOO (RLOOTrainer): A_i = r_i - (sum_j r_j - r_i) / (n - 1) within each group, n and the sum
//   over the group's non-NaN rewards; with normalize (normalize_advantages), (A - mean) / (std +
//   1e-4) over the batch (NaN-aware); NaN (and a lone scorable reward's 0/0) become 0.
//
// Per token t of completion b (TRL _compute_loss, token-level importance sampling):
//   rho = exp(logp - old_logp)   (old_logp = logp detached when num_iterations is 1)
//   l   = -min(rho A, clamp(rho, 1 - epsilon_low, 1 + epsilon_high) A)
//         + beta k3 [rho]   k3 = exp(ref - logp) - (ref - logp) - 1 (only when beta != 0); the
//                           factor rho with use_bias_correction_kl (TRL's default): the
//                           unbiased reverse-KL gradient (DeepSeek-V3.2), which differs even where
//                           rho is 1 in value, since rho carries d rho / d logp = rho
// aggregated over the completion mask m:
//   grpo     mean over sequences of sum_t l m / max(sum_t m, 1), divided by accumulation
//   bnpo     sum l m / max(sum m, 1), divided by accumulation
//   dr_grpo  sum l m / (B max_completion_length), divided by accumulation
//   dapo     sum l m / dapo_normalizer (the generation batch's global loss-token count over the
//            processes, times accumulation / steps_per_generation: the caller's)
// Metrics as TRL logs them: clip_ratio/{low_mean, high_mean, region_mean} (masked means of
// rho < 1 - eps_low with A < 0, rho > 1 + eps_high with A > 0, either), clip_ratio/low_min and
// clip_ratio/high_max (over sequences of their masked means), and kl (masked mean of k3) when
// beta != 0. The gradient follows torch: clamp passes no gradient outside its range.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace leantune {

// NaN-aware mean and Bessel-corrected std of v[b, e) (TRL's nanmean / nanstd): NaN for no
// values, and the std NaN for one value, as torch gives.
std::pair<double, double> nan_mean_std(const std::vector<double>& v, size_t b, size_t e);
// A metric value for JSON: NaN is logged as null, as TRL's logger leaves None.
nlohmann::json nan_as_null(double v);

// Why a generation batch's rewards (groups of num_generations) cannot be used, or "" when they
// can: an infinite reward (a weighted sum that overflowed), or a group's or the whole batch's
// NaN-aware mean or std beyond a double (rewards near +-1.8e308), which would make every
// advantage 0 or NaN. NaN rewards (no reward) are allowed.
std::string nonfinite_rewards(const std::vector<double>& rewards, int64_t num_generations);

std::vector<double> grpo_advantages(const std::vector<double>& rewards, int64_t num_generations,
                                    const std::string& scale_rewards);
std::vector<double> rloo_advantages(const std::vector<double>& rewards, int64_t num_generations,
                                    bool normalize = false);

struct GrpoLossConfig {
  std::string loss_type = "dapo";  // grpo | bnpo | dr_grpo | dapo
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;
  double beta = 0.0;
  bool use_bias_correction_kl = true;  // the KL term times rho (GRPOConfig's default)
  int64_t max_completion_length = 512;
};

// One completion: per-token log-probabilities (policy, behaviour policy, reference when beta is
// not 0), its loss mask, and its advantage.
struct GrpoSequence {
  std::vector<double> logp, old_logp, ref_logp;
  std::vector<uint8_t> mask;
  double advantage = 0;
};

struct GrpoLossResult {
  double loss = 0;
  std::vector<std::vector<double>> dlogp;  // d loss / d logp[b][t]
  nlohmann::json metrics;
};

// accumulation: the gradient accumulation steps grpo/bnpo/dr_grpo divide by; dapo_normalizer:
// dapo's divisor (see above). Error(kInput) for an unknown loss_type or mismatched lengths.
GrpoLossResult grpo_loss(const GrpoLossConfig& cfg, const std::vector<GrpoSequence>& seqs,
                         double accumulation, double dapo_normalizer);

}  // namespace leantune
