// Adafactor (engine/optim_adafactor.h) against a float64 reference written from
// transformers.optimization.Adafactor.step (scale_parameter=False, relative_step=False,
// beta1=None, the Trainer's optim="adafactor"): factored 2-D (awkward 71 x 229) and unfactored
// 1-D (19) parameters over four steps with weight decay and a gradient scale, a bf16 parameter
// without master copy, state sizes and a restart from saved state.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/optim_adafactor.h"
#include "testing/testing.h"

namespace leantune {
namespace {

struct RefAdafactor {
  int64_t rows, cols;  // cols == 0: 1-D
  std::vector<double> p, row, col, v;
  void step(const std::vector<double>& grad, double lr, double wd, double gs, int t) {
    const double beta2t = 1.0 - std::pow(t, -0.8);
    const size_t n = p.size();
    std::vector<double> g(n), u(n), upd(n);
    for (size_t i = 0; i < n; ++i) {
      g[i] = gs * grad[i];
      u[i] = g[i] * g[i] + 1e-30;
    }
    if (cols > 0) {
      double row_sum = 0;
      for (int64_t r = 0; r < rows; ++r) {
        double m = 0;
        for (int64_t c = 0; c < cols; ++c) m += u[r * cols + c];
        row[r] = beta2t * row[r] + (1 - beta2t) * m / cols;
        row_sum += row[r];
      }
      for (int64_t c = 0; c < cols; ++c) {
        double m = 0;
        for (int64_t r = 0; r < rows; ++r) m += u[r * cols + c];
        col[c] = beta2t * col[c] + (1 - beta2t) * m / rows;
      }
      const double row_mean = row_sum / rows;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          upd[r * cols + c] = g[r * cols + c] / std::sqrt(row[r] / row_mean) / std::sqrt(col[c]);
    } else {
      for (size_t i = 0; i < n; ++i) {
        v[i] = beta2t * v[i] + (1 - beta2t) * u[i];
        upd[i] = g[i] / std::sqrt(v[i]);
      }
    }
    double ss = 0;
    for (double x : upd) ss += x * x;
    const double div = std::max(std::sqrt(ss / n) / 1.0, 1.0);
    for (size_t i = 0; i < n; ++i) {
      p[i] += -wd * lr * p[i];
      p[i] -= upd[i] / div * lr;
    }
  }
};

class AdafactorShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(AdafactorShapes, MatchesTheTransformersAlgorithm) {
  const Shape shape = GetParam();
  const int64_t n = shape_numel(shape);
  Tensor p = testing::randn(shape, DType::kF32, 3, Device::cpu(), 0.2);
  RefAdafactor ref;
  ref.rows = shape.size() == 2 ? shape[0] : n;
  ref.cols = shape.size() == 2 ? shape[1] : 0;
  ref.p = p.to_f64();
  ref.row.assign(ref.rows, 0.0);
  ref.col.assign(ref.cols, 0.0);
  ref.v.assign(n, 0.0);
  Adafactor opt({{"w", p, true}}, AdafactorConfig{1e-30, 1.0, -0.8, 0.05});
  for (int t = 1; t <= 4; ++t) {
    Tensor g = testing::randn(shape, DType::kF32, 30 + t, Device::cpu(), 0.01 * t);
    p.set_grad(g);
    opt.step(1e-2, 0.5);
    ref.step(g.to_f64(), 1e-2, 0.05, 0.5, t);
  }
  const std::vector<double> got = p.to_f64();
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], ref.p[i], 2e-6) << i;
  // The first steps move the weights by about lr (the update is clipped to rms 1).
  EXPECT_GT(
      std::abs(got[0] - testing::randn(shape, DType::kF32, 3, Device::cpu(), 0.2).to_f64()[0]),
      1e-3);
  const int64_t state = shape.size() == 2 ? 4 * (shape[0] + shape[1]) : 4 * n;
  EXPECT_EQ(opt.state_bytes(), state);

  // A restart from the saved state continues as the original does.
  Tensor p2 = p.clone();
  Adafactor second({{"w", p2, true}}, AdafactorConfig{1e-30, 1.0, -0.8, 0.05});
  second.load_state_tensors(opt.state_tensors());
  second.set_step_count(opt.step_count());
  Tensor g = testing::randn(shape, DType::kF32, 99, Device::cpu(), 0.01);
  p.set_grad(g);
  p2.set_grad(g);
  opt.step(1e-2);
  second.step(1e-2);
  EXPECT_EQ(p.to_f32(), p2.to_f32());
}

INSTANTIATE_TEST_SUITE_P(Shapes, AdafactorShapes,
                         ::testing::Values(Shape{71, 229}, Shape{19}, Shape{1, 1}),
                         [](const auto& info) {
                           std::string s;
                           for (int64_t d : info.param)
                             s += (s.empty() ? "" : "x") + std::to_string(d);
                           return s;
                         });

TEST(Adafactor, Bf16ParameterHasNoMasterAndIsRoundedOnce) {
  Tensor p = testing::randn({33, 8}, DType::kBF16, 5, Device::cpu(), 0.5);
  const std::vector<float> before = p.to_f32();
  Adafactor opt({{"w", p, true}}, AdafactorConfig{});
  p.set_grad(testing::randn({33, 8}, DType::kBF16, 6));
  opt.step(0.05);
  EXPECT_EQ(opt.state_bytes(), 4 * (33 + 8));  // row and col only
  const std::vector<float> after = p.to_f32();
  int moved = 0;
  for (size_t i = 0; i < after.size(); ++i) moved += after[i] != before[i];
  EXPECT_GT(moved, static_cast<int>(after.size()) / 2);
}

}  // namespace
}  // namespace leantune
