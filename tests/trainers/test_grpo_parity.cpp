// Parity of the online trainers' host math with TRL 1.16 (tests/fixtures/gen_grpo_fixtures.py):
// GRPOTrainer._compute_loss for every loss_type with and without beta, with and without
// use_bias_correction_kl (loss, d loss / d logp, clip ratios, kl) and RLOOTrainer._compute_loss,
// within 1e-6 relative; and the advantages TRL's own reward-to-advantage code gives for fixed
// rewards (NaNs included): GRPO for each scale_rewards, RLOO with and without the KL penalty and
// normalize_advantages.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

#include "loaders/fs_util.h"
#include "testing/testing.h"
#include "trainers/online/grpo_loss.h"

namespace leantune {
namespace {

const nlohmann::json& fixture() {
  static const nlohmann::json j =
      nlohmann::json::parse(read_text_file(testing::fixture_path("online/grpo_cases.json")));
  return j;
}

double num(const nlohmann::json& v) { return v.is_null() ? std::nan("") : v.get<double>(); }

void expect_close(double got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got << " vs NaN";
    return;
  }
  EXPECT_NEAR(got, want, 1e-6 * std::max(1.0, std::abs(want))) << what;
}

std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (const auto& c : fixture()["cases"]) n.push_back(c["name"].get<std::string>());
  return n;
}

class GrpoParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GrpoParity, LossGradientAndMetricsMatchTrl) {
  const nlohmann::json& f = fixture();
  nlohmann::json c;
  for (const auto& x : f["cases"])
    if (x["name"] == GetParam()) c = x;
  ASSERT_FALSE(c.is_null());
  const auto logp = f["logp"].get<std::vector<std::vector<double>>>();
  const auto old_shift = f["old_shift"].get<std::vector<std::vector<double>>>();
  const auto ref_shift = f["ref_shift"].get<std::vector<std::vector<double>>>();
  const auto mask = f["mask"].get<std::vector<std::vector<int>>>();
  const auto adv = f["advantages"].get<std::vector<double>>();
  const double gas = f["gradient_accumulation_steps"].get<double>();
  const bool rloo = c["kind"] == "rloo";
  std::vector<GrpoSequence> seqs(logp.size());
  GrpoLossConfig cfg;
  cfg.epsilon_low = c["epsilon"].get<double>();
  cfg.epsilon_high = c["epsilon_high"].get<double>();
  cfg.max_completion_length = f["max_completion_length"].get<int64_t>();
  for (size_t b = 0; b < logp.size(); ++b) {
    GrpoSequence& s = seqs[b];
    s.advantage = adv[b];
    if (rloo) {
      // RLOO's sequence-level loss is the grpo aggregation over one "token" per sequence.
      double lp = 0, old = 0;
      for (size_t t = 0; t < logp[b].size(); ++t)
        if (mask[b][t]) {
          lp += logp[b][t];
          old += logp[b][t] + old_shift[b][t];
        }
      s.logp = {lp};
      s.old_logp = {old};
      s.mask = {1};
      continue;
    }
    for (size_t t = 0; t < logp[b].size(); ++t) {
      s.logp.push_back(logp[b][t]);
      s.old_logp.push_back(c["old"].get<bool>() ? logp[b][t] + old_shift[b][t] : logp[b][t]);
      s.ref_logp.push_back(logp[b][t] + ref_shift[b][t]);
      s.mask.push_back(static_cast<uint8_t>(mask[b][t]));
    }
  }
  if (rloo) {
    cfg.loss_type = "grpo";
  } else {
    cfg.loss_type = c["loss_type"].get<std::string>();
    cfg.beta = c["beta"].get<double>();
    cfg.use_bias_correction_kl = c["use_bias_correction_kl"].get<bool>();
  }
  // dapo: the generation batch's loss tokens rescaled to one accumulation window.
  const double dapo =
      f["num_items_in_batch"].get<double>() * gas / f["steps_per_generation"].get<double>();
  const GrpoLossResult r = grpo_loss(cfg, seqs, gas, dapo);
  // RLOOTrainer._compute_loss returns the loss before gradient accumulation (the HF Trainer
  // divides it by the accumulation steps in training_step); GRPO's is already divided.
  const double unscaled = rloo ? gas : 1.0;
  expect_close(r.loss * unscaled, c["loss"].get<double>(), "loss");
  auto grad = c["grad"].get<std::vector<std::vector<double>>>();
  for (auto& row : grad)
    for (double& x : row) x /= unscaled;
  for (size_t b = 0; b < grad.size(); ++b) {
    if (rloo) {
      // d loss / d (sum of masked logps) reaches every counted token alike.
      for (size_t t = 0; t < grad[b].size(); ++t)
        expect_close(mask[b][t] ? r.dlogp[b][0] : 0.0, grad[b][t],
                     "grad[" + std::to_string(b) + "][" + std::to_string(t) + "]");
      continue;
    }
    for (size_t t = 0; t < grad[b].size(); ++t)
      expect_close(r.dlogp[b][t], grad[b][t],
                   "grad[" + std::to_string(b) + "][" + std::to_string(t) + "]");
  }
  for (auto it = c["metrics"].begin(); it != c["metrics"].end(); ++it) {
    if (it.key() == "entropy") continue;  // the fixture's entropies are made up; not ours
    ASSERT_TRUE(r.metrics.contains(it.key())) << it.key() << " not logged";
    expect_close(num(r.metrics[it.key()]), num(it.value()), it.key());
  }
}

// Readable names: the case name with what gtest does not allow in a name replaced by '_'.
INSTANTIATE_TEST_SUITE_P(Trl, GrpoParity, ::testing::ValuesIn(case_names()), [](const auto& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

std::vector<double> weighted_rewards(const nlohmann::json& a) {
  const auto w = a["reward_weights"].get<std::vector<double>>();
  std::vector<double> r;
  for (const auto& row : a["rewards_per_func"]) {
    double s = 0;
    bool any = false;
    for (size_t k = 0; k < w.size(); ++k) {
      const double v = num(row[k]);
      if (std::isnan(v)) continue;
      s += w[k] * v;
      any = true;
    }
    r.push_back(any ? s : std::nan(""));
  }
  return r;
}

TEST(GrpoParity, AdvantagesMatchTrl) {
  const nlohmann::json& a = fixture()["advantage_cases"];
  const int64_t g = a["num_generations"].get<int64_t>();
  const std::vector<double> rewards = weighted_rewards(a);
  for (const auto& c : a["grpo"]) {
    const std::string scale = c["scale_rewards"].get<std::string>();
    for (size_t i = 0; i < rewards.size(); ++i)
      expect_close(rewards[i], num(c["rewards"][i]), "reward " + std::to_string(i));
    const std::vector<double> adv = grpo_advantages(rewards, g, scale);
    for (size_t i = 0; i < adv.size(); ++i)
      expect_close(adv[i], num(c["advantages"][i]), scale + " advantage " + std::to_string(i));
  }
  for (const auto& c : a["rloo"]) {
    const double beta = c["beta"].get<double>();
    std::vector<double> r = rewards;
    for (size_t i = 0; i < r.size(); ++i) r[i] -= beta * num(c["kl"][i]);
    for (size_t i = 0; i < r.size(); ++i)
      expect_close(r[i], num(c["rewards"][i]), "rloo reward " + std::to_string(i));
    const std::vector<double> adv = rloo_advantages(r, g, c["normalize_advantages"].get<bool>());
    for (size_t i = 0; i < adv.size(); ++i)
      expect_close(adv[i], num(c["advantages"][i]),
                   "rloo beta " + std::to_string(beta) + " advantage " + std::to_string(i));
  }
}

}  // namespace
}  // namespace leantune
