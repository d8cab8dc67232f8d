// preference_loss: the analytic gradients of every loss type and f-divergence against central
// finite differences in float64, hand-computed values of the textbook cases, the metrics, and the
// option errors (exit-2 class Error naming the option).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/check.h"
#include "trainers/dpo/preference_loss.h"

namespace leantune {
namespace {

PreferencePairs pairs() {
  PreferencePairs p;
  p.chosen_logps = {-12.5, -3.25, -20.0};
  p.rejected_logps = {-14.0, -2.5, -19.0};
  p.ref_chosen_logps = {-13.0, -3.0, -22.5};
  p.ref_rejected_logps = {-13.5, -4.0, -18.0};
  p.chosen_tokens = {5, 1, 9};
  p.rejected_tokens = {7, 2, 4};
  p.chosen_loss_tokens = {5, 1, 9};
  return p;
}

struct Variant {
  std::string name;
  PreferenceLossConfig cfg;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (const std::string& t : preference_loss_types()) {
    PreferenceLossConfig c;
    c.loss_types = {t};
    if (t == "robust" || t == "exo_pair") c.label_smoothing = 0.2;
    v.push_back({t, c});
  }
  for (const char* f : {"forward_kl", "js_divergence", "alpha_divergence"})
    for (const char* t : {"sigmoid", "ipo", "sigmoid_norm", "hinge"}) {
      PreferenceLossConfig c;
      c.loss_types = {t};
      c.f_divergence_type = f;
      c.f_alpha_divergence_coef = 0.4;
      c.beta = 0.3;
      v.push_back({std::string(t) + "_" + f, c});
    }
  PreferenceLossConfig mix;
  mix.loss_types = {"sigmoid", "sft", "bco_pair"};
  mix.loss_weights = {0.7, 0.2, 1.5};
  v.push_back({"weighted_mix", mix});
  return v;
}

class PreferenceLossGrad : public ::testing::TestWithParam<Variant> {};

TEST_P(PreferenceLossGrad, AnalyticGradientMatchesFiniteDifferences) {
  const PreferenceLossConfig& c = GetParam().cfg;
  validate_preference_loss(c);
  const PreferencePairs p = pairs();
  const PreferenceLossResult r = preference_loss(c, p);
  ASSERT_TRUE(std::isfinite(r.loss));
  const double h = 1e-6;
  for (size_t i = 0; i < p.chosen_logps.size(); ++i)
    for (int side = 0; side < 2; ++side) {
      PreferencePairs a = p, b = p;
      (side == 0 ? a.chosen_logps : a.rejected_logps)[i] += h;
      (side == 0 ? b.chosen_logps : b.rejected_logps)[i] -= h;
      const double fd = (preference_loss(c, a).loss - preference_loss(c, b).loss) / (2 * h);
      const double an = (side == 0 ? r.dchosen : r.drejected)[i];
      EXPECT_NEAR(an, fd, 1e-7 + 1e-6 * std::abs(fd)) << "pair " << i << " side " << side;
    }
}

INSTANTIATE_TEST_SUITE_P(Losses, PreferenceLossGrad, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) { return i.param.name; });

TEST(PreferenceLoss, SigmoidValueAndMetricsByHand) {
  PreferenceLossConfig c;  // sigmoid, beta 0.1
  const PreferencePairs p = pairs();
  const PreferenceLossResult r = preference_loss(c, p);
  double want = 0, margins = 0;
  int acc = 0;
  for (size_t i = 0; i < 3; ++i) {
    const double rw = p.chosen_logps[i] - p.ref_chosen_logps[i];
    const double rl = p.rejected_logps[i] - p.ref_rejected_logps[i];
    want += std::log1p(std::exp(-0.1 * (rw - rl))) / 3;
    margins += 0.1 * (rw - rl) / 3;
    acc += rw > rl;
  }
  EXPECT_NEAR(r.loss, want, 1e-15);
  EXPECT_NEAR(r.rewards_margins, margins, 1e-15);
  EXPECT_DOUBLE_EQ(r.rewards_accuracies, acc / 3.0);
  EXPECT_NEAR(r.rewards_chosen, 0.1 * (0.5 - 0.25 + 2.5) / 3, 1e-15);
  EXPECT_NEAR(r.logps_rejected, (-14.0 - 2.5 - 19.0) / 3, 1e-13);
}

TEST(PreferenceLoss, SftIsTheChosenTokenMean) {
  PreferenceLossConfig c;
  c.loss_types = {"sft"};
  const PreferenceLossResult r = preference_loss(c, pairs());
  EXPECT_NEAR(r.loss, (12.5 + 3.25 + 20.0) / 15.0, 1e-15);
}

TEST(PreferenceLoss, BadOptionsAreInputErrorsNamingTheOption) {
  auto err = [](PreferenceLossConfig c) -> std::string {
    try {
      validate_preference_loss(c);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      return e.what();
    }
    return "";
  };
  PreferenceLossConfig c;
  c.loss_types = {"sigmoid", "ipo"};
  c.loss_weights = {1.0};
  EXPECT_NE(err(c).find("option --loss_weights: 1 weights for 2 loss types"), std::string::npos);
  c = {};
  c.loss_types = {"kto"};
  EXPECT_NE(err(c).find("option --loss_type: 'kto'"), std::string::npos);
  c = {};
  c.loss_types = {"exo_pair"};
  EXPECT_NE(err(c).find("option --label_smoothing"), std::string::npos);
  c = {};
  c.loss_types = {"robust"};
  c.label_smoothing = 0.5;
  EXPECT_NE(err(c).find("option --label_smoothing"), std::string::npos);
  c = {};
  c.beta = 0;
  EXPECT_NE(err(c).find("option --beta"), std::string::npos);
}

}  // namespace
}  // namespace leantune
