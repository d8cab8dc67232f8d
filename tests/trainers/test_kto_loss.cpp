// The KTO loss against TRL's KTOTrainer (fixtures from tests/fixtures/gen_kto_fixtures.py): loss,
// metrics and the first step's gradient on the tiny Qwen2 models, through the trainer's
// collation and the chunked per-sequence log-probabilities; and the loss's own gradient against
// finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/ops.h"
#include "loaders/examples.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "models/decoder.h"
#include "models/ref_model.h"
#include "testing/testing.h"
#include "trainers/kto/kto.h"
#include "trainers/kto/kto_loss.h"

namespace leantune {
namespace {

nlohmann::json fixture_meta() {
  return nlohmann::json::parse(read_text_file(testing::fixture_path("kto/cases.json")));
}

double rel(double a, double e) { return std::abs(a - e) / std::max(std::abs(e), 1e-12); }

class KtoParity : public ::testing::TestWithParam<std::string> {};

TEST_P(KtoParity, LossMetricsAndFirstStepGradientMatchTrl) {
  const nlohmann::json meta = fixture_meta();
  nlohmann::json c;
  for (const auto& x : meta["cases"])
    if (x["name"] == GetParam()) c = x;
  ASSERT_FALSE(c.is_null()) << GetParam();
  const bool swap = c.value("swap", false);
  const std::string a = testing::fixture_path("models/qwen2_tied/model");
  const std::string b = testing::fixture_path("dpo/ref_model");
  auto policy =
      std::shared_ptr<DecoderModel>(DecoderModel::load(swap ? b : a, Device::cpu(), DType::kF32));
  policy->set_requires_grad(true);
  auto ref =
      std::shared_ptr<DecoderModel>(DecoderModel::load(swap ? a : b, Device::cpu(), DType::kF32));
  KtoLossConfig cfg;
  cfg.loss_type = c["loss_type"].get<std::string>();
  cfg.beta = c.value("beta", 0.1);
  cfg.desirable_weight = c.value("desirable_weight", 1.0);
  cfg.undesirable_weight = c.value("undesirable_weight", 1.0);
  // The trainer's collation: matched sequences, and KL sequences with the completions rotated
  // by one within the batch, as TRL prepares them.
  std::vector<UnpairedExample> data;
  std::vector<bool> labels;
  for (const auto& e : meta["examples"]) {
    UnpairedExample ex;
    ex.prompt_ids = e["prompt_ids"].get<std::vector<int32_t>>();
    ex.completion_ids = e["completion_ids"].get<std::vector<int32_t>>();
    ex.label = e["label"].get<bool>();
    labels.push_back(ex.label);
    data.push_back(ex);
  }
  std::vector<int64_t> idx(data.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  const UnpairedBatch ub = collate_unpaired(data, idx, 0, "keep_start", true);
  SequenceLogpsOptions lo;
  lo.chunk_tokens = 5;
  const Batch &mb = ub.matched, &kb = ub.kl;
  const std::vector<double> ref_lp = sequence_logps(*ref, mb, lo).logps.to_f64();
  const std::vector<double> ref_kl = sequence_logps(*ref, kb, lo).logps.to_f64();
  const std::vector<double> pol_kl = sequence_logps(*policy, kb, lo).logps.to_f64();
  SequenceLogpsOptions po = lo;
  po.logit_sums = true;
  po.row_stats = true;
  kernels::SequenceLogprobs pol = sequence_logps(*policy, mb, po);
  const std::vector<double> lp = pol.logps.to_f64();
  std::vector<KtoExampleTerms> terms;
  for (size_t i = 0; i < lp.size(); ++i)
    terms.push_back(
        {lp[i], ref_lp[i], labels[i], pol.tokens[i], pol.logit_sums[i], pol.entropy_sums[i]});
  const KtoLossResult r = kto_loss(cfg, terms, pol_kl, ref_kl);
  const double want = c["loss"].get<double>();
  EXPECT_LE(rel(r.loss, want), 1e-5) << r.loss << " vs TRL " << want;
  for (auto it = c["metrics"].begin(); it != c["metrics"].end(); ++it) {
    ASSERT_TRUE(r.metrics.contains(it.key())) << it.key();
    const double e = it.value().get<double>(), got = r.metrics[it.key()].get<double>();
    EXPECT_LE(std::abs(got - e), 1e-5 * std::abs(e) + 1e-7)
        << it.key() << ": " << got << " vs " << e;
  }
  Tensor loss = loss_from_sequence_gradient(pol.logps, r.loss, r.dlogp);
  loss.backward();
  auto fx = SafetensorsFile::open(testing::fixture_path("kto/cases.safetensors"));
  std::set<std::string> keys;
  for (const auto& e : fx->entries()) keys.insert(e.name);
  int checked = 0;
  for (const auto& [name, p] : policy->named_parameters()) {
    const std::string key = GetParam() + ".grad." + name;
    if (!keys.count(key)) continue;
    const Tensor e = fx->tensor(key);
    EXPECT_TRUE(testing::all_close(p.grad(), e, 1e-4 * ops::max_abs(e) + 1e-9, 1e-4)) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

INSTANTIATE_TEST_SUITE_P(TrlCases, KtoParity,
                         ::testing::Values("kto", "kto_beta_0.5_weighted", "apo_zero_unpaired",
                                           "kto_swapped", "apo_zero_unpaired_swapped"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (ch == '.') ch = '_';
                           return n;
                         });

// d loss / d logp against central differences, for both loss types, with the KL held fixed (it
// is detached in TRL) and with it clamped at 0.
TEST(KtoLoss, GradientMatchesFiniteDifferences) {
  for (const std::string type : {"kto", "apo_zero_unpaired"}) {
    for (double kl_shift : {-3.0, 2.0}) {
      KtoLossConfig cfg;
      cfg.loss_type = type;
      cfg.beta = 0.7;
      cfg.desirable_weight = 1.3;
      cfg.undesirable_weight = 0.6;
      std::vector<KtoExampleTerms> ex = {{-3.0, -2.5, true, 3, 0},
                                         {-7.0, -9.0, false, 5, 0},
                                         {-1.0, -4.0, true, 1, 0},
                                         {-2.0, -1.5, false, 2, 0}};
      const std::vector<double> kl = {-4.0 + kl_shift, -6.0, -2.0, -3.0};
      const std::vector<double> rkl = {-4.5, -6.5, -2.5, -3.5};
      const KtoLossResult r = kto_loss(cfg, ex, kl, rkl);
      EXPECT_GE(r.kl, 0.0);
      for (size_t i = 0; i < ex.size(); ++i) {
        const double h = 1e-6;
        auto at = [&](double d) {
          std::vector<KtoExampleTerms> e = ex;
          e[i].logp += d;
          return kto_loss(cfg, e, kl, rkl).loss;
        };
        const double fd = (at(h) - at(-h)) / (2 * h);
        EXPECT_NEAR(r.dlogp[i], fd, 1e-8) << type << " example " << i;
      }
    }
  }
}

TEST(KtoLoss, KlIsClampedAtZeroAndOnlyForKto) {
  KtoLossConfig cfg;
  std::vector<KtoExampleTerms> ex = {{-1.0, -1.0, true, 1, 0}};
  EXPECT_EQ(kto_loss(cfg, ex, {-5.0}, {-1.0}).kl, 0.0);  // negative estimate
  EXPECT_DOUBLE_EQ(kto_loss(cfg, ex, {-1.0}, {-3.0}).kl, 2.0);
  EXPECT_DOUBLE_EQ(kto_loss(cfg, ex, {-1.0}, {-3.0}, 0.5).kl, 0.5);  // the ranks' mean
  cfg.loss_type = "apo_zero_unpaired";
  EXPECT_EQ(kto_loss(cfg, ex, {}, {}).kl, 0.0);
}

}  // namespace
}  // namespace leantune
