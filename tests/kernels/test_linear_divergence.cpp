// linear_divergence (kernels/linear_divergence.h) against a float64 reference that forms both
// models' whole logits: forward KL, reverse KL and the generalized JSD, with temperature and
// soft-capping, masked rows, sizes 1, 19 and 71 x 229 with blocks that split rows and
// vocabulary unevenly, a wider teacher, a bf16 student; gradients by finite differences in
// float64 (gradcheck) and by the reference's analytic gradient. TRL 1.16's own
// ChunkedDivergenceFunction is compared in test_linear_divergence_trl (fixtures).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/linear_divergence.h"
#include "testing/gradcheck.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using kernels::LinearDivergenceOptions;
using Vec = std::vector<double>;
using testing::randn;

struct Ref {
  Vec div, ent, dx, dw;  // dx, dw: gradients of sum_i coef_i div_i
};

// Whole logits in double, the divergence and its gradient by the formulas of the header.
Ref reference(const Vec& xs, const Vec& ws, const Vec& xt, const Vec& wt,
              const std::vector<int64_t>& mask, int64_t n, int64_t hs, int64_t ht, int64_t v,
              const LinearDivergenceOptions& o, const Vec& coef) {
  Ref r{Vec(n, 0.0), Vec(n, 0.0), Vec(n * hs, 0.0), Vec(v * hs, 0.0)};
  const double it = 1.0 / o.temperature, b = o.beta;
  for (int64_t i = 0; i < n; ++i) {
    if (mask[i] == 0) continue;
    Vec zs(v), zt(v), th(v, 0.0);
    for (int64_t k = 0; k < v; ++k) {
      double s = 0, t = 0;
      for (int64_t j = 0; j < hs; ++j) s += xs[i * hs + j] * ws[k * hs + j];
      for (int64_t j = 0; j < ht; ++j) t += xt[i * ht + j] * wt[k * ht + j];
      if (o.student_softcap > 0) {
        th[k] = std::tanh(s / o.student_softcap);
        s = o.student_softcap * th[k];
      }
      if (o.teacher_softcap > 0) t = o.teacher_softcap * std::tanh(t / o.teacher_softcap);
      zs[k] = s * it;
      zt[k] = t * it;
    }
    auto lse = [&](const Vec& z) {
      double m = -INFINITY, s = 0;
      for (double x : z) m = std::max(m, x);
      for (double x : z) s += std::exp(x - m);
      return m + std::log(s);
    };
    const double ls = lse(zs), lt = lse(zt);
    Vec lps(v), lpt(v), lm(v);
    double fwd = 0, rev = 0, jsd = 0, kls = 0, ent = 0;
    for (int64_t k = 0; k < v; ++k) {
      lps[k] = zs[k] - ls;
      lpt[k] = zt[k] - lt;
      const double ps = std::exp(lps[k]), pt = std::exp(lpt[k]);
      fwd += pt * (lpt[k] - lps[k]);
      rev += ps * (lps[k] - lpt[k]);
      ent -= ps * lps[k];
      if (b > 0 && b < 1) {
        lm[k] = std::log((1 - b) * ps + b * pt);
        jsd += b * pt * (lpt[k] - lm[k]) + (1 - b) * ps * (lps[k] - lm[k]);
        kls += ps * (lps[k] - lm[k]);
      }
    }
    r.div[i] = b == 0 ? fwd : b == 1 ? rev : jsd;
    r.ent[i] = ent;
    for (int64_t k = 0; k < v; ++k) {
      const double ps = std::exp(lps[k]);
      double g = b == 0   ? ps - std::exp(lpt[k])
                 : b == 1 ? ps * (lps[k] - lpt[k] - rev)
                          : (1 - b) * ps * (lps[k] - lm[k] - kls);
      g *= coef[i] * it;
      if (o.student_softcap > 0) g *= 1 - th[k] * th[k];
      for (int64_t j = 0; j < hs; ++j) {
        r.dx[i * hs + j] += g * ws[k * hs + j];
        r.dw[k * hs + j] += g * xs[i * hs + j];
      }
    }
  }
  return r;
}

struct Case {
  std::string name;
  int64_t n, hs, ht, v;
  double beta, temperature, s_cap, t_cap;
  int64_t chunk_tokens, chunk_vocab;
  DType student = DType::kF32;
};

class LinearDivergenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(LinearDivergenceTest, MatchesTheFloat64Reference) {
  const Case& c = GetParam();
  const Tensor xs = randn({c.n, c.hs}, c.student, 1),
               ws = randn({c.v, c.hs}, c.student, 2, Device::cpu(), 0.5);
  const Tensor xt = randn({c.n, c.ht}, DType::kF32, 3),
               wt = randn({c.v, c.ht}, DType::kF32, 4, Device::cpu(), 0.5);
  std::vector<int64_t> mask(static_cast<size_t>(c.n), 1);
  for (int64_t i = 2; i < c.n; i += 5) mask[i] = 0;
  const LinearDivergenceOptions o{.beta = c.beta,
                                  .temperature = c.temperature,
                                  .student_softcap = c.s_cap,
                                  .teacher_softcap = c.t_cap,
                                  .chunk_tokens = c.chunk_tokens,
                                  .chunk_vocab = c.chunk_vocab};
  Tensor xs_g = xs.detach(), ws_g = ws.detach();
  xs_g.set_requires_grad(true);
  ws_g.set_requires_grad(true);
  const Tensor m = Tensor::from_vector<int64_t>(mask, {c.n});
  const kernels::LinearDivergence out = kernels::linear_divergence(xs_g, ws_g, xt, wt, m, o);
  const Vec coef = randn({c.n}, DType::kF64, 5).to_f64();
  const Ref r = reference(xs.to_f64(), ws.to_f64(), xt.to_f64(), wt.to_f64(), mask, c.n, c.hs, c.ht,
                          c.v, o, coef);
  const DType work = DType::kF32;
  EXPECT_EQ(out.divergence.dtype(), work);
  // bf16 inputs are exact in the reference (it reads the same values); what remains is f32
  // accumulation of the projections.
  const double tol = 2e-5 * std::sqrt(static_cast<double>(std::max(c.hs, c.ht)));
  EXPECT_TRUE(testing::all_close(out.divergence.to(DType::kF64),
                                 Tensor::from_vector<double>(r.div, {c.n}), tol, 1e-4));
  EXPECT_TRUE(testing::all_close(out.entropy.to(DType::kF64),
                                 Tensor::from_vector<double>(r.ent, {c.n}), tol, 1e-4));
  for (int64_t i = 0; i < c.n; ++i) {
    if (mask[i] == 0) {
      EXPECT_EQ(out.divergence.to_f64()[i], 0.0);
    }
  }
  for (double d : out.divergence.to_f64()) EXPECT_GE(d, -1e-5);  // divergences are >= 0
  out.divergence.backward(Tensor::from_vector<double>(coef, {c.n}).to(DType::kF32));
  const double gtol = c.student == DType::kBF16 ? 2e-2 : 1e-4;
  EXPECT_TRUE(testing::all_close(xs_g.grad().to(DType::kF64),
                                 Tensor::from_vector<double>(r.dx, {c.n, c.hs}), gtol, gtol));
  EXPECT_TRUE(testing::all_close(ws_g.grad().to(DType::kF64),
                                 Tensor::from_vector<double>(r.dw, {c.v, c.hs}), gtol, gtol));
  EXPECT_EQ(xs_g.grad().dtype(), c.student);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LinearDivergenceTest,
    ::testing::Values(
        Case{"forward_kl_1row", 1, 8, 8, 19, 0.0, 1.0, 0, 0, 4, 7},
        Case{"reverse_kl_19", 19, 16, 16, 71, 1.0, 1.0, 0, 0, 5, 32},
        Case{"jsd_19_t2", 19, 16, 16, 71, 0.5, 2.0, 0, 0, 19, 71},
        Case{"jsd_beta_0_1_71x229", 71, 24, 40, 229, 0.1, 0.7, 0, 0, 16, 64},
        Case{"jsd_softcaps", 19, 16, 24, 71, 0.9, 1.0, 3.0, 5.0, 8, 30},
        Case{"forward_kl_bf16_student", 19, 16, 16, 71, 0.0, 1.0, 0, 0, 7, 16, DType::kBF16},
        Case{"reverse_kl_softcap_wide_teacher", 19, 8, 32, 71, 1.0, 1.5, 2.0, 0, 6, 20}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(LinearDivergence, GradcheckInFloat64) {
  for (double beta : {0.0, 0.3, 1.0}) {
    LinearDivergenceOptions o;
    o.beta = beta;
    o.temperature = 1.3;
    o.student_softcap = 4.0;
    o.chunk_tokens = 3;
    o.chunk_vocab = 5;
    const Tensor xt = randn({7, 5}, DType::kF64, 13), wt = randn({11, 5}, DType::kF64, 14);
    const Tensor m = Tensor::from_vector<int64_t>({1, 1, 0, 1, 1, 1, 0}, {7});
    auto f = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{kernels::linear_divergence(in[0], in[1], xt, wt, m, o).divergence};
    };
    EXPECT_TRUE(
        testing::gradcheck(f, {randn({7, 4}, DType::kF64, 11), randn({11, 4}, DType::kF64, 12)}))
        << "beta " << beta;
  }
}

// No row counts: zero divergence and entropy, zero gradients of the right shapes and dtypes.
TEST(LinearDivergence, EveryRowMaskedGivesZeros) {
  Tensor x = randn({5, 4}, DType::kF32, 1).set_requires_grad(true);
  Tensor w = randn({7, 4}, DType::kF32, 2).set_requires_grad(true);
  const Tensor xt = randn({5, 6}, DType::kF32, 3), wt = randn({7, 6}, DType::kF32, 4);
  const auto out =
      kernels::linear_divergence(x, w, xt, wt, Tensor::from_vector<int64_t>({0, 0, 0, 0, 0}, {5}));
  EXPECT_EQ(out.divergence.to_f64(), std::vector<double>(5, 0.0));
  EXPECT_EQ(out.entropy.to_f64(), std::vector<double>(5, 0.0));
  out.divergence.backward(Tensor::full({5}, 1.0, DType::kF32));
  EXPECT_EQ(x.grad().to_f64(), std::vector<double>(20, 0.0));
  EXPECT_EQ(w.grad().to_f64(), std::vector<double>(28, 0.0));
  EXPECT_EQ(x.grad().shape(), x.shape());
}

TEST(LinearDivergence, RejectsBadOperands) {
  const Tensor x = randn({3, 4}, DType::kF32, 1), w = randn({5, 4}, DType::kF32, 2);
  const Tensor m = Tensor::from_vector<int64_t>({1, 1, 1}, {3});
  LinearDivergenceOptions o;
  EXPECT_THROW(kernels::linear_divergence(x, w, x, randn({6, 4}, DType::kF32, 3), m, o), Error);
  EXPECT_THROW(kernels::linear_divergence(x, w, randn({2, 4}, DType::kF32, 3), w, m, o), Error);
  o.beta = 1.5;
  EXPECT_THROW(kernels::linear_divergence(x, w, x, w, m, o), Error);
  o.beta = 0.5;
  o.temperature = 0;
  EXPECT_THROW(kernels::linear_divergence(x, w, x, w, m, o), Error);
}

// A student equal to its teacher: every divergence is zero, whatever beta.
TEST(LinearDivergence, IdenticalModelsHaveNoDivergence) {
  const Tensor x = randn({19, 8}, DType::kF64, 1), w = randn({71, 8}, DType::kF64, 2);
  const Tensor m = Tensor::from_vector<int64_t>(std::vector<int64_t>(19, 1), {19});
  for (double beta : {0.0, 0.5, 1.0}) {
    LinearDivergenceOptions o;
    o.beta = beta;
    o.chunk_vocab = 16;
    for (double d : kernels::linear_divergence(x, w, x, w, m, o).divergence.to_f64())
      EXPECT_NEAR(d, 0.0, 1e-12) << beta;
  }
}

}  // namespace
}  // namespace leantune
