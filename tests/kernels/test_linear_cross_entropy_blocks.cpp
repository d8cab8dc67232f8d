// linear_cross_entropy_weight_blocks (kernels/linear_cross_entropy_blocks.cpp) against the fused
// linear_cross_entropy on the same inputs: the loss, dhidden (through autograd) and the weight's
// gradient assembled from the sink's blocks. f64 within 1e-12, f32 within 1e-6, bf16 within the
// bf16 tolerance of a float64 reference; blocks that do not divide the vocabulary; one token;
// every row ignored; blocks handed out in order, each exactly once; d loss other than 1 is an
// error; the peak of gradient memory is one block, never the [V, H] gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear_cross_entropy.h"
#include "testing/testing.h"

namespace leantune {
namespace {

struct Case {
  DType dt;
  int64_t t, h, v, chunk, block;
  bool all_ignored = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  const Case& c = p.param;
  return std::string(dtype_name(c.dt)) + "_T" + std::to_string(c.t) + "_H" + std::to_string(c.h) +
         "_V" + std::to_string(c.v) + "_C" + std::to_string(c.chunk) + "_B" +
         std::to_string(c.block) + (c.all_ignored ? "_ignored" : "");
}

Tensor targets_for(const Case& c) {
  std::vector<int64_t> y(static_cast<size_t>(c.t));
  for (int64_t i = 0; i < c.t; ++i)
    y[i] = c.all_ignored || i % 4 == 3 ? kernels::kIgnoreIndex
                                       : (i % 4 == 0   ? 0
                                          : i % 4 == 1 ? c.v - 1
                                                       : (i * 31) % c.v);
  return Tensor::from_vector(y, {c.t});
}

struct Result {
  double loss;
  Tensor dhidden, dweight;
};

// The blocked op, its sink's blocks assembled into a [V, H] f64 gradient.
Result run_blocks(const Tensor& x0, const Tensor& w0, const Tensor& y, const Case& c) {
  Tensor x = x0.clone().set_requires_grad(true);
  Tensor w = w0.clone().set_requires_grad(true);
  std::vector<double> dw(static_cast<size_t>(c.v * c.h), std::nan(""));
  int64_t next = 0;
  auto sink = [&](int64_t row0, const Tensor& g) {
    EXPECT_EQ(row0, next) << "blocks out of order";
    EXPECT_EQ(g.dtype(), w.dtype());
    EXPECT_EQ(g.size(1), c.h);
    const std::vector<double> gv = g.to_f64();
    std::copy(gv.begin(), gv.end(), dw.begin() + row0 * c.h);
    next = row0 + g.size(0);
  };
  Tensor loss = kernels::linear_cross_entropy_weight_blocks(x, w, y, 7.0, sink, {c.chunk}, c.block);
  EXPECT_EQ(next, c.v) << "not every row of the weight was handed out";
  loss.backward();
  EXPECT_FALSE(w.grad().defined()) << "the weight's gradient must go through the sink only";
  return {loss.item(), x.grad(), Tensor::from_doubles(dw, {c.v, c.h}, DType::kF64)};
}

Result run_fused(const Tensor& x0, const Tensor& w0, const Tensor& y, const Case& c) {
  Tensor x = x0.clone().set_requires_grad(true);
  Tensor w = w0.clone().set_requires_grad(true);
  Tensor loss = kernels::linear_cross_entropy(x, w, y, 7.0, {c.chunk});
  loss.backward();
  return {loss.item(), x.grad(), w.grad()};
}

class LinearCrossEntropyBlocks : public ::testing::TestWithParam<Case> {};

TEST_P(LinearCrossEntropyBlocks, EqualsTheFusedLossAndItsGradients) {
  const Case c = GetParam();
  const Tensor x = testing::randn({c.t, c.h}, c.dt, 5, Device::cpu(), 1.0);
  const Tensor w = testing::randn({c.v, c.h}, c.dt, 6, Device::cpu(), 0.5);
  const Tensor y = targets_for(c);
  const Result b = run_blocks(x, w, y, c);
  // The reference: the fused op in float64 on the same (rounded) values.
  const Result r = run_fused(x.to(DType::kF64), w.to(DType::kF64), y, c);
  const testing::Tol tol = c.dt == DType::kF64   ? testing::Tol{1e-12, 1e-12}
                           : c.dt == DType::kF32 ? testing::Tol{1e-6, 1e-6}
                                                 : testing::tol(c.dt);
  EXPECT_NEAR(b.loss, r.loss, tol.atol + tol.rtol * std::abs(r.loss));
  EXPECT_TRUE(testing::all_close(b.dhidden.to(DType::kF64), r.dhidden, tol));
  EXPECT_TRUE(testing::all_close(b.dweight, r.dweight, tol));
  if (c.dt != DType::kF64) {
    // No worse than the fused op in the same dtype (flash-attention's rule, with 2x margin).
    // When the fused error is itself a few ulps, twice it is rounding noise: the floor is 4 ulps
    // of the largest gradient value.
    const Result f = run_fused(x, w, y, c);
    const double err_b = testing::max_abs_diff(b.dweight, r.dweight);
    const double err_f = testing::max_abs_diff(f.dweight.to(DType::kF64), r.dweight);
    const double ulp = c.dt == DType::kF32 ? 0x1p-23 : 0x1p-7;
    const double floor = 4 * ulp * ops::max_abs(r.dweight);
    EXPECT_LE(err_b, 2 * err_f + floor) << "blocked " << err_b << " vs fused " << err_f;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearCrossEntropyBlocks,
                         ::testing::Values(Case{DType::kF64, 19, 13, 229, 8, 16},
                                           Case{DType::kF64, 1, 19, 71, 4, 71},
                                           Case{DType::kF32, 71, 19, 229, 16, 7},
                                           Case{DType::kF32, 19, 32, 229, 64, 256},
                                           Case{DType::kF32, 19, 13, 71, 5, 9, true},
                                           Case{DType::kBF16, 71, 32, 229, 32, 16}),
                         case_name);

TEST(LinearCrossEntropyBlocksChecks, BackwardWithAnotherDlossIsAnError) {
  Tensor x = testing::randn({5, 8}, DType::kF32, 1).set_requires_grad(true);
  Tensor w = testing::randn({11, 8}, DType::kF32, 2).set_requires_grad(true);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4}, {5});
  Tensor loss = kernels::linear_cross_entropy_weight_blocks(
      x, w, y, 5.0, [](int64_t, const Tensor&) {}, {}, 4);
  EXPECT_THROW(ops::scale(loss, 2.0).backward(), Error);
  EXPECT_THROW(kernels::linear_cross_entropy_weight_blocks(
                   x, w, Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 11}, {5}), 5.0,
                   [](int64_t, const Tensor&) {}, {}, 4),
               Error);
}

TEST(LinearCrossEntropyBlocksChecks, BlockRowsFallOn256ElementBlocks) {
  for (int64_t h : {1, 19, 32, 896, 4096, 3584})
    EXPECT_EQ(kernels::weight_grad_block_rows(h) * h % 256, 0) << "hidden " << h;
  EXPECT_EQ(kernels::weight_grad_block_rows(4096), 2048);  // 32 MiB of f32
}

TEST(LinearCrossEntropyBlocksMemory, GradientPeakIsOneBlockNotTheWholeHead) {
  const int64_t t = 64, h = 32, v = 4096, block = 256;
  Tensor x = testing::randn({t, h}, DType::kF32, 3).set_requires_grad(true);
  Tensor w = testing::randn({v, h}, DType::kF32, 4).set_requires_grad(true);
  const Tensor y = targets_for({DType::kF32, t, h, v, 16, block});
  Allocator& a = allocator(Device::cpu());
  a.reset_peak_stats();
  const int64_t grads_before = a.stats().tag(MemTag::kGrad).current;
  const int64_t ws_before = a.stats().tag(MemTag::kWorkspace).current;
  Tensor loss = kernels::linear_cross_entropy_weight_blocks(
      x, w, y, 1.0, [](int64_t, const Tensor&) {}, {16}, block);
  const AllocatorStats s = a.stats();
  // f32 weights: the block's f32 gradient is workspace and nothing of weight size is allocated.
  EXPECT_EQ(s.tag(MemTag::kGrad).peak - grads_before, 0);
  EXPECT_LE(s.tag(MemTag::kWorkspace).peak - ws_before,
            (block * h + 16 * block + t * h + 2 * t) * 4 + 4096);
  EXPECT_LT(s.tag(MemTag::kWorkspace).peak - ws_before, v * h * 4 / 4);
  loss.backward();
}

}  // namespace
}  // namespace leantune
