// GRPO/RLOO advantages and the GRPO loss family on the host (see grpo_loss.h).
#include "trainers/online/grpo_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/check.h"

namespace leantune {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void check_groups(size_t n, int64_t g, const char* what) {
  LT_CHECK_INPUT(g >= 1, what, ": num_generations ", g, " must be at least 1");
  LT_CHECK_INPUT(n % static_cast<size_t>(g) == 0, what, ": ", n,
                 " rewards are not whole groups of num_generations ", g);
}

}  // namespace

nlohmann::json nan_as_null(double v) {
  return std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
}

std::pair<double, double> nan_mean_std(const std::vector<double>& v, size_t b, size_t e) {
  double sum = 0;
  int64_t n = 0;
  for (size_t i = b; i < e; ++i)
    if (!std::isnan(v[i])) {
      sum += v[i];
      ++n;
    }
  if (n == 0) return {kNaN, kNaN};
  const double mean = sum / static_cast<double>(n);
  double sq = 0;
  for (size_t i = b; i < e; ++i)
    if (!std::isnan(v[i])) sq += (v[i] - mean) * (v[i] - mean);
  const double var = sq / static_cast<double>(n);
  // nanstd: variance * count / (count - 1); one value gives inf * 0 = NaN, as torch does.
  const double corrected = n > 1 ? var * static_cast<double>(n) / static_cast<double>(n - 1) : kNaN;
  return {mean, std::sqrt(corrected)};
}

std::string nonfinite_rewards(const std::vector<double>& rewards, int64_t num_generations) {
  check_groups(rewards.size(), num_generations, "nonfinite_rewards");
  for (size_t i = 0; i < rewards.size(); ++i)
    if (std::isinf(rewards[i]))
      return "reward " + std::to_string(i + 1) + " is " + (rewards[i] > 0 ? "+" : "-") + "inf";
  auto stats = [&](size_t b, size_t e, const std::string& what) -> std::string {
    const auto [mean, std] = nan_mean_std(rewards, b, e);
    if (std::isinf(mean)) return what + " reward mean overflows";
    if (std::isinf(std)) return what + " reward standard deviation overflows";
    return "";
  };
  const size_t g = static_cast<size_t>(num_generations);
  for (size_t b = 0; b < rewards.size(); b += g) {
    const std::string why = stats(b, b + g, "group " + std::to_string(b / g + 1) + "'s");
    if (!why.empty()) return why;
  }
  return stats(0, rewards.size(), "the batch's");
}

std::vector<double> grpo_advantages(const std::vector<double>& rewards, int64_t num_generations,
                                    const std::string& scale_rewards) {
  LT_CHECK_INPUT(scale_rewards == "group" || scale_rewards == "batch" || scale_rewards == "none",
                 "option scale_rewards ", scale_rewards, ": expected group, batch or none");
  check_groups(rewards.size(), num_generations, "grpo_advantages");
  const size_t g = static_cast<size_t>(num_generations), n = rewards.size();
  std::vector<double> a(n);
  const auto [batch_mean, batch_std] = nan_mean_std(rewards, 0, n);
  (void)batch_mean;
  for (size_t b = 0; b < n; b += g) {
    const auto [mean, group_std] = nan_mean_std(rewards, b, b + g);
    const double std =
        scale_rewards == "batch" ? (n > 1 ? batch_std : 0.0) : (g > 1 ? group_std : 0.0);
    for (size_t i = b; i < b + g; ++i) {
      double x = rewards[i] - mean;
      if (scale_rewards != "none") x /= std + 1e-4;
      a[i] = std::isnan(x) ? 0.0 : x;
    }
  }
  return a;
}

std::vector<double> rloo_advantages(const std::vector<double>& rewards, int64_t num_generations,
                                    bool normalize) {
  check_groups(rewards.size(), num_generations, "rloo_advantages");
  LT_CHECK_INPUT(num_generations >= 2, "rloo: num_generations ", num_generations,
                 " must be at least 2 (the baseline leaves one out)");
  const size_t g = static_cast<size_t>(num_generations), n = rewards.size();
  std::vector<double> a(n);
  for (size_t b = 0; b < n; b += g) {
    // The baseline averages the scorable siblings only (nansum over count - 1).
    double sum = 0;
    int64_t scorable = 0;
    for (size_t i = b; i < b + g; ++i)
      if (!std::isnan(rewards[i])) {
        sum += rewards[i];
        ++scorable;
      }
    for (size_t i = b; i < b + g; ++i)
      a[i] = rewards[i] - (sum - rewards[i]) / static_cast<double>(scorable - 1);
  }
  if (normalize) {
    const auto [mean, std] = nan_mean_std(a, 0, n);
    for (double& x : a) x = (x - mean) / (std + 1e-4);
  }
  for (double& x : a)
    if (std::isnan(x) || std::isinf(x)) x = 0.0;
  return a;
}

GrpoLossResult grpo_loss(const GrpoLossConfig& cfg, const std::vector<GrpoSequence>& seqs,
                         double accumulation, double dapo_normalizer) {
  const std::string& lt = cfg.loss_type;
  LT_CHECK_INPUT(lt == "grpo" || lt == "bnpo" || lt == "dr_grpo" || lt == "dapo",
                 "option loss_type ", lt, ": expected grpo, bnpo, dr_grpo or dapo");
  LT_CHECK(accumulation > 0 && (lt != "dapo" || dapo_normalizer > 0), "grpo_loss: accumulation ",
           accumulation, ", dapo normaliser ", dapo_normalizer);
  const size_t nb = seqs.size();
  GrpoLossResult r;
  r.dlogp.resize(nb);
  int64_t all_tokens = 0;
  for (const GrpoSequence& s : seqs) {
    const size_t t = s.logp.size();
    LT_CHECK(
        s.old_logp.size() == t && s.mask.size() == t && (cfg.beta == 0.0 || s.ref_logp.size() == t),
        "grpo_loss: a completion of ", t, " tokens has ", s.old_logp.size(), " old, ",
        s.ref_logp.size(), " reference log-probabilities and ", s.mask.size(), " mask values");
    for (uint8_t m : s.mask) all_tokens += m ? 1 : 0;
  }
  // The weight of token t of sequence b in the aggregate (its loss is multiplied by it).
  auto weight = [&](size_t b) {
    int64_t mb = 0;
    for (uint8_t m : seqs[b].mask) mb += m ? 1 : 0;
    if (lt == "grpo")
      return 1.0 / (static_cast<double>(std::max<int64_t>(mb, 1)) * static_cast<double>(nb) *
                    accumulation);
    if (lt == "bnpo")
      return 1.0 / (static_cast<double>(std::max<int64_t>(all_tokens, 1)) * accumulation);
    if (lt == "dr_grpo")
      return 1.0 / (static_cast<double>(nb) * static_cast<double>(cfg.max_completion_length) *
                    accumulation);
    return 1.0 / dapo_normalizer;
  };
  double loss = 0, kl_sum = 0, low = 0, high = 0, region = 0;
  double low_min = std::numeric_limits<double>::infinity();
  double high_max = -std::numeric_limits<double>::infinity();
  const double lo = 1.0 - cfg.epsilon_low, hi = 1.0 + cfg.epsilon_high;
  for (size_t b = 0; b < nb; ++b) {
    const GrpoSequence& s = seqs[b];
    const double w = weight(b), a = s.advantage;
    r.dlogp[b].assign(s.logp.size(), 0.0);
    double seq_low = 0, seq_high = 0;
    int64_t mb = 0;
    for (size_t t = 0; t < s.logp.size(); ++t) {
      if (!s.mask[t]) continue;
      ++mb;
      const double rho = std::exp(s.logp[t] - s.old_logp[t]);
      const double clipped = std::clamp(rho, lo, hi);
      double l, d;
      if (rho * a <= clipped * a) {  // the unclipped term is the min (a tie: both agree)
        l = -rho * a;
        d = -a * rho;
      } else {  // the clipped term: no gradient through the clamp outside its range
        l = -clipped * a;
        d = rho > lo && rho < hi ? -a * rho : 0.0;
      }
      if (cfg.beta != 0.0) {
        const double x = s.ref_logp[t] - s.logp[t];
        const double k3 = std::exp(x) - x - 1.0, dk3 = 1.0 - std::exp(x);
        // With the correction: d (k3 rho) = dk3 rho + k3 rho.
        const double kl = cfg.use_bias_correction_kl ? k3 * rho : k3;
        l += cfg.beta * kl;
        d += cfg.beta * (cfg.use_bias_correction_kl ? (dk3 + k3) * rho : dk3);
        kl_sum += kl;
      }
      loss += l * w;
      r.dlogp[b][t] = d * w;
      const bool is_low = rho < lo && a<0, is_high = rho> hi && a > 0;
      low += is_low;
      high += is_high;
      region += is_low || is_high;
      seq_low += is_low;
      seq_high += is_high;
    }
    // TRL's masked per-sequence means: 0/0 is NaN, which nanmin/nanmax skip.
    if (mb > 0) {
      low_min = std::min(low_min, seq_low / static_cast<double>(mb));
      high_max = std::max(high_max, seq_high / static_cast<double>(mb));
    }
  }
  r.loss = loss;
  const double denom = static_cast<double>(std::max<int64_t>(all_tokens, 1));
  r.metrics = {{"clip_ratio/low_mean", low / denom},
               {"clip_ratio/high_mean", high / denom},
               {"clip_ratio/region_mean", region / denom},
               {"clip_ratio/low_min", std::isinf(low_min) ? kNaN : low_min},
               {"clip_ratio/high_max", std::isinf(high_max) ? kNaN : high_max}};
  if (cfg.beta != 0.0) r.metrics["kl"] = kl_sum / denom;
  return r;
}

}  // namespace leantune
