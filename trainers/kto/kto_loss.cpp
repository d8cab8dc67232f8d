// The KTO loss (see kto_loss.h).
#include "trainers/kto/kto_loss.h"

#include <algorithm>
#include <cmath>

#include "engine/check.h"

namespace leantune {
namespace {

double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

}  // namespace

const OptionTable<KtoLossConfig>& kto_loss_table() {
  using C = KtoLossConfig;
  static const OptionTable<C> t =
      OptionTable<C>()
          .text("loss_type", &C::loss_type,
                "kto (desirable and undesirable completions against a KL estimate from "
                "mismatched pairs) or apo_zero_unpaired (no KL term)",
                {"kto", "apo_zero_unpaired"})
          .real("beta", &C::beta, "temperature of the implied reward beta * log(pi / pi_ref)", 0.0)
          .real("desirable_weight", &C::desirable_weight, "weight of desirable examples' losses",
                0.0)
          .real("undesirable_weight", &C::undesirable_weight,
                "weight of undesirable examples' losses", 0.0);
  return t;
}

KtoLossConfig kto_loss_config(const Options& o) {
  const KtoLossConfig c = kto_loss_table().read(o);
  LT_CHECK_INPUT(c.beta > 0, "option beta ", c.beta, ": must be positive");
  return c;
}

double kto_batch_kl(const std::vector<double>& kl_logps, const std::vector<double>& ref_kl_logps) {
  LT_CHECK(kl_logps.size() == ref_kl_logps.size(), "kto: ", kl_logps.size(), " KL logps, ",
           ref_kl_logps.size(), " reference ones");
  if (kl_logps.empty()) return 0.0;
  double s = 0;
  for (size_t i = 0; i < kl_logps.size(); ++i) s += kl_logps[i] - ref_kl_logps[i];
  return s / static_cast<double>(kl_logps.size());
}

KtoLossResult kto_loss(const KtoLossConfig& cfg, const std::vector<KtoExampleTerms>& ex,
                       const std::vector<double>& kl_logps, const std::vector<double>& ref_kl_logps,
                       std::optional<double> kl_override) {
  LT_CHECK(cfg.loss_type == "kto" || cfg.loss_type == "apo_zero_unpaired", "kto: loss_type ",
           cfg.loss_type);
  KtoLossResult r;
  const size_t n = ex.size();
  r.dlogp.assign(n, 0.0);
  if (kto_uses_kl(cfg)) {
    LT_CHECK(kl_logps.size() == n, "kto: ", n, " examples, ", kl_logps.size(), " KL sequences");
    r.kl = std::max(0.0, kl_override ? *kl_override : kto_batch_kl(kl_logps, ref_kl_logps));
  }
  const double b = cfg.beta;
  double sum = 0;
  double rew_c = 0, rew_r = 0, lp_c = 0, lp_r = 0, lg_c = 0, lg_r = 0, entropy = 0;
  int64_t n_c = 0, n_r = 0, tok_c = 0, tok_r = 0;
  for (size_t i = 0; i < n; ++i) {
    const double ratio = ex[i].logp - ex[i].ref_logp;
    double loss_i = 0, d = 0;
    if (ex[i].desirable) {
      // 1 - sigmoid(z), z = beta (ratio - kl): d/dratio = -beta s (1 - s).
      const double z = b * (ratio - (kto_uses_kl(cfg) ? r.kl : 0.0));
      const double s = sigmoid(z);
      loss_i = cfg.desirable_weight * (1.0 - s);
      d = -cfg.desirable_weight * b * s * (1.0 - s);
      rew_c += b * ratio;
      lp_c += ex[i].logp;
      lg_c += ex[i].logit_sum;
      tok_c += ex[i].completion_tokens;
      ++n_c;
    } else {
      if (kto_uses_kl(cfg)) {
        // 1 - sigmoid(beta (kl - ratio)): d/dratio = +beta s (1 - s).
        const double s = sigmoid(b * (r.kl - ratio));
        loss_i = cfg.undesirable_weight * (1.0 - s);
        d = cfg.undesirable_weight * b * s * (1.0 - s);
      } else {
        const double s = sigmoid(b * ratio);
        loss_i = cfg.undesirable_weight * s;
        d = cfg.undesirable_weight * b * s * (1.0 - s);
      }
      rew_r += b * ratio;
      lp_r += ex[i].logp;
      lg_r += ex[i].logit_sum;
      tok_r += ex[i].completion_tokens;
      ++n_r;
    }
    sum += loss_i;
    entropy += ex[i].entropy_sum;
    r.dlogp[i] = d;
  }
  const double inv = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  r.loss = sum * inv;
  for (double& d : r.dlogp) d *= inv;
  // TRL's entropy: the mean over every completion token of the batch, both labels.
  const int64_t tokens = tok_c + tok_r;
  r.metrics = {{"kl", r.kl}, {"entropy", tokens > 0 ? entropy / static_cast<double>(tokens) : 0.0}};
  if (n_c > 0) {
    r.metrics["rewards/chosen"] = rew_c / n_c;
    r.metrics["logps/chosen"] = lp_c / n_c;
  }
  if (n_r > 0) {
    r.metrics["rewards/rejected"] = rew_r / n_r;
    r.metrics["logps/rejected"] = lp_r / n_r;
  }
  if (n_c > 0 && n_r > 0) r.metrics["rewards/margins"] = rew_c / n_c - rew_r / n_r;
  if (tok_c > 0) r.metrics["logits/chosen"] = lg_c / static_cast<double>(tok_c);
  if (tok_r > 0) r.metrics["logits/rejected"] = lg_r / static_cast<double>(tok_r);
  return r;
}

}  // namespace leantune
