// DPO's pairwise losses and their gradients in float64: see the header for the formulas.
#include "trainers/dpo/preference_loss.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "engine/check.h"

namespace leantune {

namespace {

double sig(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}
// log sigmoid(x), stable for large |x|.
double log_sig(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

// Score s(r) and ds/dr for the f-divergence.
struct Score {
  double s, ds;
};
Score score(const PreferenceLossConfig& c, double r) {
  const std::string& f = c.f_divergence_type;
  if (f == "forward_kl") return {1.0 - std::exp(-r), std::exp(-r)};
  if (f == "js_divergence") return {std::log(2.0) + log_sig(r), sig(-r)};
  if (f == "alpha_divergence" && std::abs(c.f_alpha_divergence_coef - 1.0) >= 1e-6) {
    const double a1 = c.f_alpha_divergence_coef - 1.0;
    const double t = a1 * r;
    const double tc = std::min(t, 80.0);  // TRL clamps the exponent (f32/bf16: 80)
    return {(std::exp(tc) - 1.0) / a1, t > 80.0 ? 0.0 : std::exp(tc)};
  }
  return {r, 1.0};
}

}  // namespace

const std::vector<std::string>& preference_loss_types() {
  static const std::vector<std::string> t = {"sigmoid",  "hinge",    "ipo",      "exo_pair",
                                             "nca_pair", "robust",   "bco_pair", "sppo_hard",
                                             "apo_zero", "apo_down", "sft",      "sigmoid_norm"};
  return t;
}

void validate_preference_loss(const PreferenceLossConfig& c) {
  LT_CHECK_INPUT(!c.loss_types.empty(), "option --loss_type: no loss type given");
  for (const std::string& t : c.loss_types) {
    const auto& all = preference_loss_types();
    if (std::find(all.begin(), all.end(), t) == all.end()) {
      std::string names;
      for (const auto& n : all) names += (names.empty() ? "" : ", ") + n;
      LT_THROW(ErrorKind::kInput, "option --loss_type: '", t, "' is not one of ", names);
    }
  }
  LT_CHECK_INPUT(c.loss_weights.empty() || c.loss_weights.size() == c.loss_types.size(),
                 "option --loss_weights: ", c.loss_weights.size(), " weights for ",
                 c.loss_types.size(), " loss types (give one weight per --loss_type)");
  for (double w : c.loss_weights)
    LT_CHECK_INPUT(std::isfinite(w), "option --loss_weights: ", w, " is not a finite number");
  LT_CHECK_INPUT(c.beta > 0 && std::isfinite(c.beta), "option --beta: ", c.beta,
                 " must be positive");
  const auto has = [&](const char* t) {
    return std::find(c.loss_types.begin(), c.loss_types.end(), t) != c.loss_types.end();
  };
  LT_CHECK_INPUT((c.label_smoothing >= 0 && c.label_smoothing < 0.5) || !has("robust"),
                 "option --label_smoothing: ", c.label_smoothing,
                 " must be in [0, 0.5) for loss_type robust");
  LT_CHECK_INPUT((c.label_smoothing > 0 && c.label_smoothing < 1) || !has("exo_pair"),
                 "option --label_smoothing: ", c.label_smoothing,
                 " must be in (0, 1) for loss_type exo_pair (its loss has log(label_smoothing))");
  LT_CHECK_INPUT(c.label_smoothing >= 0 && c.label_smoothing < 1,
                 "option --label_smoothing: ", c.label_smoothing, " must be in [0, 1)");
  const std::string& f = c.f_divergence_type;
  LT_CHECK_INPUT(
      f == "reverse_kl" || f == "forward_kl" || f == "js_divergence" || f == "alpha_divergence",
      "option --f_divergence_type: '", f,
      "' is not one of reverse_kl, forward_kl, js_divergence, alpha_divergence");
}

PreferenceLossResult preference_loss(const PreferenceLossConfig& c, const PreferencePairs& p) {
  const size_t n = p.chosen_logps.size();
  LT_CHECK(p.rejected_logps.size() == n && p.ref_chosen_logps.size() == n &&
               p.ref_rejected_logps.size() == n && p.chosen_tokens.size() == n &&
               p.rejected_tokens.size() == n,
           "preference_loss: inconsistent pair counts");
  LT_CHECK(n > 0, "preference_loss: no pairs");
  PreferenceLossResult r;
  r.dchosen.assign(n, 0.0);
  r.drejected.assign(n, 0.0);
  const double beta = c.beta, eps = c.label_smoothing, inv_n = 1.0 / static_cast<double>(n);
  for (size_t k = 0; k < c.loss_types.size(); ++k) {
    const std::string& t = c.loss_types[k];
    const double w = c.loss_weights.empty() ? 1.0 : c.loss_weights[k];
    double total = 0;
    if (t == "sft") {
      int64_t tokens = 0;
      double sum = 0;
      for (size_t i = 0; i < n; ++i) {
        sum += p.chosen_logps[i];
        tokens += p.chosen_loss_tokens.empty() ? p.chosen_tokens[i] : p.chosen_loss_tokens[i];
      }
      // TRL: -mean over the batch's chosen tokens (0 tokens: nothing to learn from).
      if (tokens > 0) {
        const double inv_t = 1.0 / static_cast<double>(tokens);
        r.loss_by_type.push_back(-sum * inv_t);
        r.loss += w * -sum * inv_t;
        for (size_t i = 0; i < n; ++i) r.dchosen[i] += w * -inv_t;
      } else {
        r.loss_by_type.push_back(0.0);
      }
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      const double rw = p.chosen_logps[i] - p.ref_chosen_logps[i];
      const double rl = p.rejected_logps[i] - p.ref_rejected_logps[i];
      const Score sw = score(c, rw), sl = score(c, rl);
      const double nw = static_cast<double>(std::max<int64_t>(p.chosen_tokens[i], 1));
      const double nl = static_cast<double>(std::max<int64_t>(p.rejected_tokens[i], 1));
      const double z = beta * (sw.s - sl.s);
      double loss = 0, dw = 0, dl = 0;  // d loss / d r_w, d r_l
      // Losses of z = beta (s_w - s_l): dL/dr_w = g beta s'_w, dL/dr_l = -g beta s'_l.
      auto from_z = [&](double g) {
        dw = g * beta * sw.ds;
        dl = -g * beta * sl.ds;
      };
      if (t == "sigmoid") {
        loss = -log_sig(z);
        from_z(-sig(-z));
      } else if (t == "hinge") {
        loss = std::max(0.0, 1.0 - z);
        from_z(z < 1.0 ? -1.0 : 0.0);
      } else if (t == "ipo" || t == "sigmoid_norm") {
        const double d = sw.s / nw - sl.s / nl;
        double g;
        if (t == "ipo") {
          const double e = d - 1.0 / (2.0 * beta);
          loss = e * e;
          g = 2.0 * e;
        } else {
          loss = -log_sig(beta * d);
          g = -beta * sig(-beta * d);
        }
        dw = g * sw.ds / nw;
        dl = -g * sl.ds / nl;
      } else if (t == "robust") {
        loss = (-(1.0 - eps) * log_sig(z) + eps * log_sig(-z)) / (1.0 - 2.0 * eps);
        from_z((-(1.0 - eps) * sig(-z) - eps * sig(z)) / (1.0 - 2.0 * eps));
      } else if (t == "exo_pair") {
        const double pz = sig(z), qz = sig(-z), lp = log_sig(z), lq = log_sig(-z);
        const double a = std::log1p(-eps), b = std::log(eps);
        loss = pz * (lp - a) + qz * (lq - b);
        from_z(pz * qz * (lp - lq - a + b));
      } else if (t == "nca_pair") {
        const double aw = beta * rw, al = beta * rl;
        loss = -log_sig(aw) - 0.5 * log_sig(-aw) - 0.5 * log_sig(-al);
        dw = beta * (-sig(-aw) + 0.5 * sig(aw));
        dl = beta * 0.5 * sig(al);
      } else if (t == "bco_pair") {
        const double aw = beta * rw, al = beta * rl;
        loss = -log_sig(aw) - log_sig(-al);
        dw = -beta * sig(-aw);
        dl = beta * sig(al);
      } else if (t == "sppo_hard") {
        const double ew = rw - 0.5 / beta, el = rl + 0.5 / beta;
        loss = ew * ew + el * el;
        dw = 2.0 * ew;
        dl = 2.0 * el;
      } else if (t == "apo_zero") {
        const double sw1 = sig(beta * rw), sl1 = sig(beta * rl);
        loss = 1.0 - sw1 + sl1;
        dw = -beta * sw1 * (1.0 - sw1);
        dl = beta * sl1 * (1.0 - sl1);
      } else if (t == "apo_down") {
        const double sw1 = sig(beta * rw), sm = sig(beta * (rw - rl));
        loss = sw1 + 1.0 - sm;
        dw = beta * sw1 * (1.0 - sw1) - beta * sm * (1.0 - sm);
        dl = beta * sm * (1.0 - sm);
      } else {
        LT_THROW(ErrorKind::kInput, "option --loss_type: '", t, "' is not implemented");
      }
      total += loss;
      r.dchosen[i] += w * dw * inv_n;
      r.drejected[i] += w * dl * inv_n;
    }
    r.loss_by_type.push_back(total * inv_n);
    r.loss += w * total * inv_n;
  }
  for (size_t i = 0; i < n; ++i) {
    const double cw = beta * (p.chosen_logps[i] - p.ref_chosen_logps[i]);
    const double cl = beta * (p.rejected_logps[i] - p.ref_rejected_logps[i]);
    r.chosen_rewards.push_back(cw);
    r.rejected_rewards.push_back(cl);
    r.rewards_chosen += cw * inv_n;
    r.rewards_rejected += cl * inv_n;
    r.rewards_accuracies += (cw > cl ? 1.0 : 0.0) * inv_n;
    r.rewards_margins += (cw - cl) * inv_n;
    r.logps_chosen += p.chosen_logps[i] * inv_n;
    r.logps_rejected += p.rejected_logps[i] * inv_n;
  }
  return r;
}

const OptionTable<PreferenceLossConfig>& preference_loss_table() {
  using C = PreferenceLossConfig;
  static const OptionTable<C> t =
      OptionTable<C>()
          .list("loss_type", &C::loss_types,
                "DPO loss(es): sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair, "
                "sppo_hard, apo_zero, apo_down, sft, sigmoid_norm; several are summed")
          .custom(
              [](Options& o, const C&) {
                o.add_string_list("loss_weights", {}, "one weight per loss_type (none: 1 each)");
              },
              [](const Options& o, C& c) {
                c.loss_weights.clear();
                for (const std::string& s : o.get_string_list("loss_weights")) {
                  char* end = nullptr;
                  const double v = std::strtod(s.c_str(), &end);
                  LT_CHECK_INPUT(!s.empty() && end && *end == '\0', "option --loss_weights: '", s,
                                 "' is not a number");
                  c.loss_weights.push_back(v);
                }
              },
              "loss_weights")
          .real("beta", &C::beta,
                "temperature of the implicit reward (deviation from the reference)")
          .real("label_smoothing", &C::label_smoothing,
                "probability that a preference label is flipped (robust, exo_pair)", 0.0)
          .text("f_divergence_type", &C::f_divergence_type,
                "the divergence that defines the scores",
                {"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"})
          .real("f_alpha_divergence_coef", &C::f_alpha_divergence_coef,
                "alpha of alpha_divergence");
  return t;
}

PreferenceLossConfig preference_loss_config(const Options& o) {
  const PreferenceLossConfig c = preference_loss_table().read(o);
  validate_preference_loss(c);
  return c;
}

}  // namespace leantune
