// The distribution generation samples from (models/generate.h sampling_distribution) against
// transformers' logits processors on the same logits (tests/fixtures/gen_sampling_fixtures.py):
// temperature, top_k, top_p, min_p, repetition_penalty and all of them at once, on rows with and
// without already-seen tokens; the kept tokens in order and their probabilities within 1e-6.
// Also: greedy takes the penalised maximum, and sample_token only returns kept tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/rng.h"
#include "models/generate.h"
#include "testing/testing.h"

namespace leantune {
namespace {

nlohmann::json fixtures() {
  std::ifstream f(testing::fixture_path("sampling/cases.json"));
  return nlohmann::json::parse(f);
}

GenerationConfig config_of(const nlohmann::json& c) {
  GenerationConfig g;
  g.temperature = c.value("temperature", 1.0);
  g.top_k = c.value("top_k", int64_t{0});
  g.top_p = c.value("top_p", 1.0);
  g.min_p = c.value("min_p", 0.0);
  g.repetition_penalty = c.value("repetition_penalty", 1.0);
  return g;
}

class Sampling : public ::testing::TestWithParam<std::string> {};

TEST_P(Sampling, DistributionMatchesTransformersProcessors) {
  const nlohmann::json fx = fixtures();
  nlohmann::json c;
  for (const auto& x : fx["cases"])
    if (x["name"] == GetParam()) c = x;
  ASSERT_FALSE(c.is_null()) << GetParam();
  const GenerationConfig g = config_of(c);
  for (size_t r = 0; r < fx["logits"].size(); ++r) {
    const std::vector<float> logits = fx["logits"][r].get<std::vector<float>>();
    const std::vector<int32_t> seen = fx["seen"][r].get<std::vector<int32_t>>();
    const SamplingDistribution d = sampling_distribution(logits, g, seen);
    const auto want_tokens = c["rows"][r]["tokens"].get<std::vector<int32_t>>();
    const auto want_probs = c["rows"][r]["probs"].get<std::vector<double>>();
    ASSERT_EQ(d.tokens, want_tokens) << "row " << r;
    for (size_t i = 0; i < want_probs.size(); ++i)
      EXPECT_NEAR(d.probs[i], want_probs[i], 1e-6) << "row " << r << " token " << d.tokens[i];
    // A draw only ever returns a kept token.
    Generator gen(7, RngPurpose::kSampling);
    for (int k = 0; k < 20; ++k) {
      const int32_t t = sample_token(logits, g, gen, seen);
      EXPECT_NE(std::find(want_tokens.begin(), want_tokens.end(), t), want_tokens.end());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, Sampling,
                         ::testing::Values("temperature", "top_k", "top_p", "min_p",
                                           "repetition_penalty", "all"),
                         [](const auto& info) { return info.param; });

TEST(SamplingGreedy, TakesThePenalisedMaximum) {
  GenerationConfig g;
  g.temperature = 0.0;
  g.repetition_penalty = 2.0;
  // Token 0 leads (4 vs 3) until it is penalised (4 / 2 = 2 < 3); a negative logit grows.
  EXPECT_EQ(sampling_distribution({4.0f, 3.0f, -1.0f}, g).tokens[0], 0);
  EXPECT_EQ(sampling_distribution({4.0f, 3.0f, -1.0f}, g, {0, 0}).tokens[0], 1);
  Generator gen(1, RngPurpose::kSampling);
  EXPECT_EQ(sample_token({4.0f, 3.0f, -1.0f}, g, gen, {0}), 1);
  g.repetition_penalty = 0.0;
  EXPECT_THROW(sampling_distribution({1.0f}, g), Error);
}

}  // namespace
}  // namespace leantune
