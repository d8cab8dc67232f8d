#include <gtest/gtest.h>

#include <cmath>

#include "engine/optim.h"
#include "testing/testing.h"

namespace leantune {
namespace {

// Reference AdamW in double, written from torch.optim.AdamW's documented algorithm.
struct RefAdamW {
  std::vector<double> p, m, v;
  void step(const std::vector<double>& g, double lr, double b1, double b2, double eps, double wd,
            int t) {
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(b1, t));
      const double vh = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
};

TEST(AdamW, MatchesReferenceInF64) {
  const int64_t n = 37;
  Tensor p = testing::randn({n}, DType::kF64, 1);
  RefAdamW ref{p.to_f64(), std::vector<double>(n), std::vector<double>(n)};
  AdamW opt({{"w", p, true}}, AdamWConfig{1e-2, 0.9, 0.95, 1e-8, 0.1});
  for (int t = 1; t <= 5; ++t) {
    Tensor g = testing::randn({n}, DType::kF64, 100 + t);
    p.set_grad(g);
    opt.step(1e-2 * t);
    ref.step(g.to_f64(), 1e-2 * t, 0.9, 0.95, 1e-8, 0.1, t);
  }
  std::vector<double> got = p.to_f64();
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], ref.p[i], 1e-12) << i;
  EXPECT_EQ(opt.step_count(), 5);
}

TEST(AdamW, Bf16ParamsKeepF32MasterAndState) {
  const int64_t n = 19;
  Tensor p = testing::randn({n}, DType::kBF16, 2);
  Allocator& a = allocator(Device::cpu());
  const int64_t before = a.stats().tag(MemTag::kOptimizer).current;
  RefAdamW ref{p.to_f64(), std::vector<double>(n), std::vector<double>(n)};
  AdamW opt({{"w", p, false}}, AdamWConfig{1e-3, 0.9, 0.999, 1e-8, 0.5});
  Tensor g = testing::randn({n}, DType::kBF16, 3);
  p.set_grad(g);
  opt.step(1e-3);
  ref.step(g.to_f64(), 1e-3, 0.9, 0.999, 1e-8, 0.0 /* decay off for this param */, 1);
  // m, v and master: three f32 tensors of 19 elements, 512-byte blocks each.
  EXPECT_EQ(a.stats().tag(MemTag::kOptimizer).current - before, 3 * 512);
  EXPECT_EQ(opt.state_bytes(), 3 * 19 * 4);
  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[2].first, "w.master");
  std::vector<double> master = st[2].second.to_f64(), got = p.to_f64();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(master[i], ref.p[i], 1e-6);
    EXPECT_EQ(got[i], static_cast<double>(bf16_to_f32(f32_to_bf16(static_cast<float>(master[i])))));
  }
}

TEST(AdamW, GradScaleAndSkippedParams) {
  Tensor a = Tensor::from_vector<float>({1.0f, 2.0f}, {2});
  Tensor b = Tensor::from_vector<float>({3.0f}, {1});
  AdamW opt({{"a", a, true}, {"b", b, true}}, AdamWConfig{0.1, 0.9, 0.999, 1e-8, 0.0});
  a.set_grad(Tensor::from_vector<float>({2.0f, -4.0f}, {2}));
  opt.step(0.1, 0.5);  // b has no gradient: untouched, no state
  // First Adam step moves each element by lr * sign(g) (m_hat/sqrt(v_hat) = g/|g|).
  EXPECT_NEAR(a.to_f32()[0], 0.9f, 1e-6);
  EXPECT_NEAR(a.to_f32()[1], 2.1f, 1e-6);
  EXPECT_EQ(b.to_f32()[0], 3.0f);
  EXPECT_EQ(opt.state_tensors().size(), 2u);
}

TEST(AdamW, StateRoundTripContinuesIdentically) {
  auto make = [](uint64_t seed) { return testing::randn({23}, DType::kF32, seed); };
  Tensor p1 = make(5), p2 = make(5);
  AdamW o1({{"w", p1, true}}, AdamWConfig{1e-2, 0.9, 0.99, 1e-8, 0.01});
  AdamW o2({{"w", p2, true}}, AdamWConfig{1e-2, 0.9, 0.99, 1e-8, 0.01});
  for (int t = 0; t < 3; ++t) {
    p1.set_grad(make(10 + t));
    o1.step(1e-2);
  }
  // o2 takes o1's state and parameters, then both take the same steps.
  p2.copy_(p1);
  o2.load_state_tensors(o1.state_tensors());
  o2.set_step_count(o1.step_count());
  for (int t = 3; t < 5; ++t) {
    p1.set_grad(make(10 + t));
    p2.set_grad(make(10 + t));
    o1.step(1e-2);
    o2.step(1e-2);
  }
  EXPECT_EQ(p1.to_f32(), p2.to_f32());
  std::vector<std::pair<std::string, Tensor>> bad = {
      {"w.exp_avg", Tensor::zeros({3}, DType::kF32)}};
  EXPECT_THROW(o2.load_state_tensors(bad), Error);
}

TEST(Sgd, MatchesTorchSgdWithL2DecayAndKeepsBf16Master) {
  // f64: torch.optim.SGD (no momentum): p -= lr (gs g + wd p), checked in double.
  const int64_t n = 19;
  Tensor p = testing::randn({n}, DType::kF64, 4);
  std::vector<double> ref = p.to_f64();
  Sgd opt({{"w", p, true}}, 0.1);
  for (int t = 1; t <= 3; ++t) {
    Tensor g = testing::randn({n}, DType::kF64, 40 + t);
    p.set_grad(g);
    opt.step(0.05 * t, 0.5);
    const std::vector<double> gv = g.to_f64();
    for (int64_t i = 0; i < n; ++i) ref[i] -= 0.05 * t * (0.5 * gv[i] + 0.1 * ref[i]);
  }
  const std::vector<double> got = p.to_f64();
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], ref[i], 1e-14) << i;
  EXPECT_EQ(opt.step_count(), 3);
  EXPECT_EQ(opt.state_bytes(), 0);

  // bf16: the update runs on an f32 master ("w.master"), which a restart restores.
  Tensor b = testing::randn({71, 229}, DType::kBF16, 5);
  Sgd s1({{"w", b, false}}, 0.1);
  b.set_grad(testing::randn({71, 229}, DType::kBF16, 6));
  s1.step(1e-3);
  auto st = s1.state_tensors();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].first, "w.master");
  EXPECT_EQ(s1.state_bytes(), 71 * 229 * 4);
  const std::vector<float> master = st[0].second.to_f32(), rounded = b.to_f32();
  for (size_t i = 0; i < master.size(); i += 97)
    EXPECT_EQ(rounded[i], Tensor::full({1}, master[i], DType::kBF16).to_f32()[0]) << i;
  Tensor b2 = b.clone();
  Sgd s2({{"w", b2, false}}, 0.1);
  s2.load_state_tensors(st);
  EXPECT_EQ(s2.state_tensors()[0].second.to_f32(), master);
}

}  // namespace
}  // namespace leantune
