// embedding_weight_blocks (kernels/embedding.h): the same lookup as embedding, and a backward
// that hands the weight's gradient to a sink by blocks of rows: the blocks, assembled, equal the
// whole gradient of embedding bit for bit (CPU), every row handed out once and in order, zero
// rows included; no gradient reaches the weight through autograd; the gradient memory at the
// peak is one block. Awkward sizes: V 1, 19 and 229 in blocks of 1, 7 and more than V; ids at 0
// and V-1, repeated. The Cuda case compares the device blocks with the CPU's on fresh inputs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "kernels/embedding.h"
#include "testing/testing.h"

namespace leantune {
namespace {

struct Case {
  DType dt;
  int64_t v, h, t, block;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  return std::string(dtype_name(p.param.dt)) + "_V" + std::to_string(p.param.v) + "_H" +
         std::to_string(p.param.h) + "_T" + std::to_string(p.param.t) + "_B" +
         std::to_string(p.param.block);
}

Tensor ids_for(int64_t t, int64_t v) {
  std::vector<int64_t> id(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) id[i] = i % 3 == 0 ? 0 : i % 3 == 1 ? v - 1 : (i * 7) % v;
  return Tensor::from_vector(id, {t});
}

// Forward + backward of embedding_weight_blocks on `dev`; the blocks assembled on the host.
Tensor blocked_grad(const Tensor& w0, const Tensor& ids, const Tensor& dy, int64_t block,
                    Device dev, Tensor* y_out) {
  Tensor w = dev.is_cpu() ? w0.clone() : w0.to(dev);  // a leaf of its own, w0 untouched
  w.set_requires_grad(true);
  std::vector<Tensor> parts;
  int64_t next = 0;
  auto sink = [&](int64_t row0, const Tensor& g) {
    EXPECT_EQ(row0, next);
    EXPECT_EQ(g.dtype(), w.dtype());
    parts.push_back(g.to(Device::cpu()).clone());
    next = row0 + g.size(0);
  };
  Tensor y = kernels::embedding_weight_blocks(w, ids.to(dev), sink, block);
  y.backward(dy.to(dev));
  EXPECT_EQ(next, w0.size(0)) << "not every row was handed out";
  EXPECT_FALSE(w.grad().defined());
  if (y_out) *y_out = y.to(Device::cpu());
  std::vector<double> all;
  for (const Tensor& p : parts) {
    const std::vector<double> d = p.to_f64();
    all.insert(all.end(), d.begin(), d.end());
  }
  return Tensor::from_doubles(all, w0.shape(), DType::kF64);
}

class EmbeddingBlocks : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingBlocks, BlocksEqualTheWholeGradientBitForBit) {
  const Case c = GetParam();
  const Tensor w0 = testing::randn({c.v, c.h}, c.dt, 1);
  const Tensor ids = ids_for(c.t, c.v);
  const Tensor dy = testing::randn({c.t, c.h}, c.dt, 2);
  Tensor y;
  const Tensor got = blocked_grad(w0, ids, dy, c.block, Device::cpu(), &y);
  Tensor w = w0.clone().set_requires_grad(true);
  Tensor y_ref = kernels::embedding(w, ids);
  y_ref.backward(dy);
  EXPECT_TRUE(testing::all_close(y, y_ref, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(got, w.grad().to(DType::kF64), 0.0, 0.0));
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingBlocks,
                         ::testing::Values(Case{DType::kF32, 1, 19, 1, 1},
                                           Case{DType::kF32, 19, 13, 71, 7},
                                           Case{DType::kBF16, 229, 19, 71, 16},
                                           Case{DType::kF64, 229, 8, 19, 1000},
                                           Case{DType::kF32, 229, 32, 5, 1}),
                         case_name);

TEST(EmbeddingBlocksMemory, GradientPeakIsOneBlock) {
  const int64_t v = 4096, h = 64, t = 32, block = 256;
  Tensor w = testing::randn({v, h}, DType::kF32, 3).set_requires_grad(true);
  Tensor y = kernels::embedding_weight_blocks(
      w, ids_for(t, v), [](int64_t, const Tensor&) {}, block);
  Allocator& a = allocator(Device::cpu());
  const int64_t before = a.stats().tag(MemTag::kGrad).current;
  a.reset_peak_stats();
  y.backward(testing::randn({t, h}, DType::kF32, 4));
  EXPECT_LE(a.stats().tag(MemTag::kGrad).peak - before, block * h * 4 + 4096);
}

TEST(EmbeddingBlocksCuda, MatchesTheCpuOnFreshInputs) {
  LT_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor w0 = testing::randn({229, 19}, dt, 5);
    const Tensor ids = ids_for(71, 229);
    const Tensor dy = testing::randn({71, 19}, dt, 6);
    Tensor y_cpu, y_gpu;
    const Tensor cpu = blocked_grad(w0, ids, dy, 16, Device::cpu(), &y_cpu);
    const Tensor gpu = blocked_grad(w0, ids, dy, 16, Device::cuda(0), &y_gpu);
    EXPECT_TRUE(testing::all_close(y_gpu, y_cpu, 0.0, 0.0));
    EXPECT_TRUE(testing::all_close(gpu, cpu, testing::tol(dt)));
  }
}

}  // namespace
}  // namespace leantune
