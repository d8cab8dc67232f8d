// linear_divergence against TRL 1.16's ChunkedDivergenceFunction, the loss of its
// DistillationTrainer (tests/fixtures/gen_distill_fixtures.py -> distill/
// linear_divergence.safetensors): forward KL, reverse KL, the generalized JSD with and without
// temperature and soft-capping; divergence, student entropy and both student gradients for the
// same inputs and the same upstream gradient, in float32.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/linear_divergence.h"
#include "loaders/safetensors.h"
#include "testing/testing.h"

namespace leantune {
namespace {

std::shared_ptr<SafetensorsFile> fixture() {
  static const std::shared_ptr<SafetensorsFile> f =
      SafetensorsFile::open(testing::fixture_path("distill/linear_divergence.safetensors"));
  return f;
}
Tensor fx(const std::string& name) { return fixture()->tensor(name).contiguous(); }

class LinearDivergenceTrl : public ::testing::TestWithParam<std::string> {};

TEST_P(LinearDivergenceTrl, MatchesTrl) {
  const std::string c = GetParam();
  const nlohmann::json meta = nlohmann::json::parse(fixture()->metadata().at(c));
  kernels::LinearDivergenceOptions o;
  o.beta = meta["beta"];
  o.temperature = meta["temperature"];
  o.student_softcap = meta["student_softcap"];
  o.teacher_softcap = meta["teacher_softcap"];
  o.chunk_tokens = 7;  // TRL's tiles hold all 19 rows and 71 columns; ours split both
  o.chunk_vocab = 32;
  Tensor hs = fx(c + ".student_hidden"), ws = fx(c + ".student_weight");
  hs.set_requires_grad(true);
  ws.set_requires_grad(true);
  const int64_t n = hs.size(0);
  const Tensor mask = Tensor::from_vector<int64_t>(std::vector<int64_t>(n, 1), {n});
  const kernels::LinearDivergence out = kernels::linear_divergence(
      hs, ws, fx(c + ".teacher_hidden"), fx(c + ".teacher_weight"), mask, o);
  EXPECT_TRUE(testing::all_close(out.divergence, fx(c + ".divergence"), 2e-6, 2e-5));
  EXPECT_TRUE(testing::all_close(out.entropy, fx(c + ".entropy"), 2e-6, 2e-5));
  out.divergence.backward(fx(c + ".coef"));
  EXPECT_TRUE(testing::all_close(hs.grad(), fx(c + ".grad_hidden"), 2e-6, 2e-5));
  EXPECT_TRUE(testing::all_close(ws.grad(), fx(c + ".grad_weight"), 2e-6, 2e-5));
}

INSTANTIATE_TEST_SUITE_P(Trl, LinearDivergenceTrl,
                         ::testing::Values("fkl", "rkl", "jsd", "jsd_t2", "jsd_cap"));

}  // namespace
}  // namespace leantune
