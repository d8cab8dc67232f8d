// The small differentiable ops the families need: split_columns (Phi-3's fused projections as
// views), softcap (Gemma's final logit soft-capping on full logits) and scale (Gemma's embedding
// factor): values against float64 formulas, gradients by float64 finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops.h"
#include "kernel_test_util.h"
#include "kernels/scale.h"
#include "kernels/softcap.h"
#include "kernels/split.h"

namespace leantune {
namespace {

using testing::randn;

TEST(SplitColumns, PartsAreViewsOfTheColumnsAndGradientsAssembleOneBuffer) {
  const Tensor x = randn({19, 3 * 4 + 2 * 2 * 4}, DType::kF32, 1);
  const std::vector<Tensor> parts = kernels::split_columns(x, {{3, 4}, {2, 4}, {2, 4}});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].shape(), (Shape{19, 3, 4}));
  EXPECT_EQ(parts[2].shape(), (Shape{19, 2, 4}));
  EXPECT_TRUE(parts[1].shares_storage(x));
  const std::vector<float> xv = x.to_f32(), kv = parts[1].contiguous().to_f32();
  for (int64_t r = 0; r < 19; ++r)
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(kv[r * 8 + c], xv[r * 28 + 12 + c]);
  auto f = [](const std::vector<Tensor>& in) {
    const std::vector<Tensor> p = kernels::split_columns(in[0], {{2, 3}, {5}, {1}});
    // Each part reaches the output through a different op, so every gradient path is used.
    return std::vector<Tensor>{p[0].reshape({7, 6}), kernels::scale(p[1], 2.0), p[2].reshape({7})};
  };
  EXPECT_TRUE(testing::gradcheck(f, {randn({7, 12}, DType::kF64, 2)}));
  // A part without a gradient contributes zeros.
  Tensor y = randn({5, 6}, DType::kF64, 3).set_requires_grad(true);
  kernels::split_columns(y, {{2}, {4}})[1].backward(Tensor::full({5, 4}, 1.0, DType::kF64));
  const std::vector<double> g = y.grad().to_f64();
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(g[r * 6 + c], c < 2 ? 0.0 : 1.0);
}

TEST(Softcap, ValuesAndGradients) {
  const Tensor x = randn({71, 229}, DType::kF32, 4, Device::cpu(), 20.0);
  const Tensor y = kernels::softcap(x, 5.0);
  const std::vector<double> xv = x.to_f64(), yv = y.to_f64();
  for (size_t i = 0; i < xv.size(); ++i) {
    EXPECT_NEAR(yv[i], 5.0 * std::tanh(xv[i] / 5.0), 2e-6);
    EXPECT_LE(std::abs(yv[i]), 5.0);
  }
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::softcap(in[0], 3.0)};
  };
  EXPECT_TRUE(testing::gradcheck(f, {randn({4, 9}, DType::kF64, 5, Device::cpu(), 4.0)}));
}

TEST(Scale, RoundsOnceInTheInputDtype) {
  // Gemma's sqrt(hidden) in bf16: 2304 -> 48 exactly; 1152 -> 33.94 rounds to 34.0 in bf16.
  EXPECT_EQ(kernels::round_to_dtype(std::sqrt(1152.0), DType::kBF16), 34.0);
  EXPECT_EQ(kernels::round_to_dtype(std::sqrt(1152.0), DType::kF32),
            static_cast<double>(static_cast<float>(std::sqrt(1152.0))));
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::scale(in[0], 1.7)};
  };
  EXPECT_TRUE(testing::gradcheck(f, {randn({3, 5}, DType::kF64, 6)}));
}

}  // namespace
}  // namespace leantune
