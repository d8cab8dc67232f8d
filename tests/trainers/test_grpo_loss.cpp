// GRPO/RLOO advantages and the GRPO loss family (trainers/online/grpo_loss.h) against the anchors
// of trl_semantics.md (section 17/18: group advantages of [1,0,1,0], a constant group, the clip
// cases, k3, RLOO's leave-one-out), NaN rewards, batch scaling, each aggregation on a hand case,
// the clip metrics, and the gradient against central finite differences for every loss type,
// with and without beta (and use_bias_correction_kl), with tokens on both sides of the clip range.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/check.h"
#include "trainers/online/grpo_loss.h"

namespace leantune {
namespace {

TEST(GrpoAdvantages, AnchorsAndNaNRewards) {
  const std::vector<double> a = grpo_advantages({1, 0, 1, 0}, 4, "group");
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(a[i], i % 2 == 0 ? 0.865875 : -0.865875, 1e-6);
  for (double x : grpo_advantages({3, 3, 3, 3}, 4, "group")) EXPECT_EQ(x, 0.0);
  // Two groups, batch std: (r - group mean) / (batch std + 1e-4).
  const std::vector<double> b = grpo_advantages({1, 3, 0, 0}, 2, "batch");
  // Batch of 1, 3, 0, 0: mean 1, squared deviations 0, 4, 1, 1, Bessel-corrected over 3.
  const double sd = std::sqrt((0.0 + 4.0 + 1.0 + 1.0) / 3.0);
  EXPECT_NEAR(b[0], (1 - 2) / (sd + 1e-4), 1e-12);
  EXPECT_NEAR(b[1], (3 - 2) / (sd + 1e-4), 1e-12);
  EXPECT_EQ(b[2], 0.0);
  const std::vector<double> none = grpo_advantages({1, 3}, 2, "none");
  EXPECT_EQ(none[0], -1.0);
  EXPECT_EQ(none[1], 1.0);
  // An unscorable completion: out of the baseline, advantage 0.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> c = grpo_advantages({1, nan, 0, 1}, 4, "none");
  EXPECT_NEAR(c[0], 1 - 2.0 / 3.0, 1e-12);
  EXPECT_EQ(c[1], 0.0);
  EXPECT_THROW(grpo_advantages({1, 2, 3}, 2, "group"), Error);
  EXPECT_THROW(grpo_advantages({1, 2}, 2, "per_token"), Error);
}

TEST(RlooAdvantages, LeaveOneOut) {
  const std::vector<double> a = rloo_advantages({1, 2, 3, 6}, 4);
  const std::vector<double> want = {-2.6667, -1.3333, 0, 4};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(a[i], want[i], 1e-4);
  EXPECT_THROW(rloo_advantages({1, 2}, 1), Error);
}

GrpoSequence one_token(double rho, double a) {
  GrpoSequence s;
  s.logp = {std::log(rho)};
  s.old_logp = {0.0};
  s.mask = {1};
  s.advantage = a;
  return s;
}

TEST(GrpoLoss, ClipAnchorsAndK3) {
  GrpoLossConfig cfg;
  cfg.loss_type = "bnpo";
  const double cases[][3] = {{1.5, 1, -1.2}, {0.5, -1, 0.8}, {0.5, 1, -0.5}};
  for (const auto& c : cases)
    EXPECT_NEAR(grpo_loss(cfg, {one_token(c[0], c[1])}, 1.0, 1.0).loss, c[2], 1e-12)
        << "rho " << c[0] << " A " << c[1];
  cfg.beta = 1.0;
  GrpoSequence s = one_token(1.0, 0.0);
  s.logp = {-1.5};
  s.old_logp = {-1.5};
  s.ref_logp = {-1.0};
  const GrpoLossResult r = grpo_loss(cfg, {s}, 1.0, 1.0);
  EXPECT_NEAR(r.loss, 0.148721, 1e-6);
  EXPECT_NEAR(r.metrics["kl"].get<double>(), 0.148721, 1e-6);
}

// Two completions of 3 and 2 masked tokens (one padding token), ratios inside and outside the
// clip range on both sides.
std::vector<GrpoSequence> hand_batch(bool with_ref) {
  GrpoSequence a, b;
  a.logp = {-1.0, -2.0, -0.5, -3.0};
  a.old_logp = {-1.1, -1.5, -0.9, -3.0};
  a.mask = {1, 1, 1, 0};
  a.advantage = 0.7;
  b.logp = {-0.2, -4.0, -1.0, -1.0};
  b.old_logp = {-0.6, -3.95, -1.0, -1.0};
  b.mask = {1, 1, 0, 0};
  b.advantage = -1.3;
  if (with_ref) {
    a.ref_logp = {-1.2, -1.8, -0.7, -3.0};
    b.ref_logp = {-0.5, -3.9, -1.0, -1.0};
  }
  return {a, b};
}

class GrpoLossTypes : public ::testing::TestWithParam<std::string> {};

TEST_P(GrpoLossTypes, AggregationAndGradientMatchFiniteDifferences) {
  // with_ref: beta 0.04, without (k3) and with (k3 rho) use_bias_correction_kl.
  for (int variant : {0, 1, 2}) {
    const bool with_ref = variant > 0, bias = variant == 2;
    GrpoLossConfig cfg;
    cfg.loss_type = GetParam();
    cfg.beta = with_ref ? 0.04 : 0.0;
    cfg.use_bias_correction_kl = bias;
    cfg.max_completion_length = 6;
    const double accumulation = 2.0, dapo = 2.5;
    std::vector<GrpoSequence> seqs = hand_batch(with_ref);
    const GrpoLossResult r = grpo_loss(cfg, seqs, accumulation, dapo);
    // The aggregate from the per-token losses written out here.
    double sum_seq = 0, sum_all = 0;
    int64_t tokens = 0;
    for (const GrpoSequence& s : seqs) {
      double ls = 0;
      int64_t m = 0;
      for (size_t t = 0; t < s.logp.size(); ++t) {
        if (!s.mask[t]) continue;
        const double rho = std::exp(s.logp[t] - s.old_logp[t]);
        double l = -std::min(rho * s.advantage, std::clamp(rho, 0.8, 1.2) * s.advantage);
        if (with_ref) {
          const double x = s.ref_logp[t] - s.logp[t];
          l += cfg.beta * (std::exp(x) - x - 1) * (bias ? rho : 1.0);
        }
        ls += l;
        ++m;
      }
      sum_seq += ls / static_cast<double>(m);
      sum_all += ls;
      tokens += m;
    }
    double want = 0;
    if (cfg.loss_type == "grpo") want = sum_seq / 2.0 / accumulation;
    if (cfg.loss_type == "bnpo") want = sum_all / static_cast<double>(tokens) / accumulation;
    if (cfg.loss_type == "dr_grpo") want = sum_all / (2.0 * 6.0) / accumulation;
    if (cfg.loss_type == "dapo") want = sum_all / dapo;
    EXPECT_NEAR(r.loss, want, 1e-12) << "variant " << variant;
    const double h = 1e-6;
    for (size_t b = 0; b < seqs.size(); ++b)
      for (size_t t = 0; t < seqs[b].logp.size(); ++t) {
        std::vector<GrpoSequence> up = seqs, down = seqs;
        up[b].logp[t] += h;
        down[b].logp[t] -= h;
        const double fd = (grpo_loss(cfg, up, accumulation, dapo).loss -
                           grpo_loss(cfg, down, accumulation, dapo).loss) /
                          (2 * h);
        EXPECT_NEAR(r.dlogp[b][t], fd, 1e-7)
            << "variant " << variant << " sequence " << b << " token " << t;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GrpoLossTypes, ::testing::Values("grpo", "bnpo", "dr_grpo", "dapo"),
                         [](const auto& info) { return info.param; });

TEST(GrpoLoss, ClipMetrics) {
  // Sequence a (A > 0): ratios e^0.1 (inside), e^-0.5 (below, but A > 0: not clipped low),
  // e^0.4 (above: clipped high). Sequence b (A < 0): e^0.4 (above, A < 0: no), e^-0.05 (inside).
  const std::vector<GrpoSequence> seqs = hand_batch(false);
  const GrpoLossResult r = grpo_loss(GrpoLossConfig{}, seqs, 1.0, 5.0);
  EXPECT_NEAR(r.metrics["clip_ratio/high_mean"].get<double>(), 1.0 / 5.0, 1e-12);
  EXPECT_NEAR(r.metrics["clip_ratio/low_mean"].get<double>(), 0.0, 1e-12);
  EXPECT_NEAR(r.metrics["clip_ratio/region_mean"].get<double>(), 1.0 / 5.0, 1e-12);
  EXPECT_NEAR(r.metrics["clip_ratio/high_max"].get<double>(), 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(r.metrics["clip_ratio/low_min"].get<double>(), 0.0, 1e-12);
  EXPECT_FALSE(r.metrics.contains("kl"));
  GrpoLossConfig bad;
  bad.loss_type = "ppo";
  EXPECT_THROW(grpo_loss(bad, seqs, 1.0, 1.0), Error);
}

}  // namespace
}  // namespace leantune
