// sequence_logprobs: the chunked LM-head path equals the full-logits path (values, logit sums,
// gradients of hidden and weight) within 1e-6 in f32, both equal a float64 reference, and the
// chunked path's peak extra memory does not grow with tokens x vocabulary (allocator stats at
// vocab 151,936).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cross_entropy.h"
#include "kernels/sequence_logprobs.h"
#include "testing/testing.h"

namespace leantune::kernels {
namespace {

struct Case {
  const char* name;
  int64_t h, v;
  std::vector<int64_t> lens;  // sequence lengths
  int64_t chunk;
};

// Targets: every third row of each sequence ignored, plus the last row (as shift_labels does).
Tensor make_targets(const std::vector<int64_t>& lens, int64_t v, std::vector<int32_t>* cu) {
  std::vector<int64_t> y;
  cu->assign(1, 0);
  uint64_t s = 7;
  for (int64_t n : lens) {
    for (int64_t t = 0; t < n; ++t) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      y.push_back(t % 3 == 0 || t == n - 1 ? kIgnoreIndex : static_cast<int64_t>((s >> 33) % v));
    }
    cu->push_back(cu->back() + static_cast<int32_t>(n));
  }
  return Tensor::from_vector(y, {static_cast<int64_t>(y.size())});
}

class SequenceLogprobsTest : public ::testing::TestWithParam<Case> {};

TEST_P(SequenceLogprobsTest, ChunkedEqualsFullLogitsAndFloat64) {
  const Case& c = GetParam();
  std::vector<int32_t> cu;
  const Tensor y = make_targets(c.lens, c.v, &cu);
  const int64_t t = y.numel();
  const Tensor cut = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  const std::vector<double> g = [&] {
    std::vector<double> v;
    for (size_t b = 0; b < c.lens.size(); ++b) v.push_back(0.5 - 0.37 * static_cast<double>(b));
    return v;
  }();
  SequenceLogprobsOptions opt{c.chunk, true};
  auto run = [&](DType dt, bool fused, Tensor* dx, Tensor* dw) {
    Tensor x = testing::randn({t, c.h}, dt, 11);
    Tensor w = testing::randn({c.v, c.h}, dt, 12);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    SequenceLogprobs r =
        fused ? linear_sequence_logprobs(x, w, y, cut, opt)
              : logits_sequence_logprobs(ops::matmul(x, w, false, true), y, cut, opt);
    if (!fused) {
      // The full-logits path differentiates the logits; chain them to x and w by hand.
      return r;
    }
    r.logps.backward(Tensor::from_doubles(g, {static_cast<int64_t>(g.size())}, r.logps.dtype()));
    *dx = x.grad();
    *dw = w.grad();
    return r;
  };
  Tensor dx32, dw32, dx64, dw64, unused;
  const SequenceLogprobs f32 = run(DType::kF32, true, &dx32, &dw32);
  const SequenceLogprobs full = run(DType::kF32, false, &unused, &unused);
  const SequenceLogprobs f64 = run(DType::kF64, true, &dx64, &dw64);
  const std::vector<double> a = f32.logps.to_f64(), b = full.logps.to_f64(), e = f64.logps.to_f64();
  ASSERT_EQ(a.size(), c.lens.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i]) + 1e-6) << i;
    EXPECT_NEAR(a[i], e[i], 2e-5 * std::abs(e[i]) + 1e-5) << i;
    EXPECT_NEAR(f32.logit_sums[i], full.logit_sums[i], 1e-5 * std::abs(full.logit_sums[i]) + 1e-6);
    EXPECT_EQ(f32.tokens[i], f64.tokens[i]);
  }
  EXPECT_TRUE(testing::all_close(dx32, dx64, 1e-5, 1e-4));
  EXPECT_TRUE(testing::all_close(dw32, dw64, 1e-5, 1e-4));
}

// The logits path's gradient (through the logits) equals the chunked path's.
TEST_P(SequenceLogprobsTest, FullLogitsGradientEqualsChunked) {
  const Case& c = GetParam();
  std::vector<int32_t> cu;
  const Tensor y = make_targets(c.lens, c.v, &cu);
  const Tensor cut = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  const int64_t t = y.numel();
  Tensor x = testing::randn({t, c.h}, DType::kF64, 21);
  Tensor w = testing::randn({c.v, c.h}, DType::kF64, 22);
  std::vector<double> g(c.lens.size());
  for (size_t b = 0; b < g.size(); ++b) g[b] = 1.0 - 0.25 * static_cast<double>(b);
  const Tensor gt = Tensor::from_doubles(g, {static_cast<int64_t>(g.size())}, DType::kF64);
  Tensor z = ops::matmul(x, w, false, true);
  z.set_requires_grad(true);
  SequenceLogprobs full = logits_sequence_logprobs(z, y, cut, {c.chunk, false});
  full.logps.backward(gt);
  // d/dx = dZ W, d/dw = dZ^T X from the full path's dZ.
  const Tensor dx_full = ops::matmul(z.grad(), w);
  const Tensor dw_full = ops::matmul(z.grad(), x, true, false);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  SequenceLogprobs ch = linear_sequence_logprobs(x, w, y, cut, {c.chunk, false});
  ch.logps.backward(gt);
  EXPECT_TRUE(testing::all_close(x.grad(), dx_full, 1e-12, 1e-10));
  EXPECT_TRUE(testing::all_close(w.grad(), dw_full, 1e-12, 1e-10));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SequenceLogprobsTest,
                         ::testing::Values(Case{"one_token_seqs", 8, 19, {1, 2, 1, 3}, 4},
                                           Case{"awkward", 71, 229, {19, 1, 33, 7}, 16},
                                           Case{"chunk_one", 16, 50, {5, 9}, 1},
                                           Case{"single_chunk", 12, 300, {40, 25, 8}, 4096}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });

// Peak bytes above the starting point while computing the logps and their gradient.
int64_t peak_extra(int64_t t, int64_t v, int64_t h, int64_t chunk, bool fused) {
  Allocator& a = allocator(Device::cpu());
  std::vector<int32_t> cu{0, static_cast<int32_t>(t / 2), static_cast<int32_t>(t)};
  std::vector<int64_t> yv(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) yv[i] = (i * 7919) % v;
  const Tensor y = Tensor::from_vector(yv, {t});
  const Tensor cut = Tensor::from_vector(cu, {3});
  Tensor x = testing::randn({t, h}, DType::kF32, 1);
  Tensor w = testing::randn({v, h}, DType::kF32, 2);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  // The weight gradient ([V, H], as large as the weight) is not what is measured: allocate it
  // before the baseline.
  w.set_grad(Tensor::zeros({v, h}, DType::kF32, Device::cpu(), MemTag::kGrad));
  x.set_grad(Tensor::zeros({t, h}, DType::kF32, Device::cpu(), MemTag::kGrad));
  a.reset_peak_stats();
  const int64_t base = a.stats().allocated.current;
  {
    Tensor z;
    if (!fused) {
      z = ops::matmul(x.detach(), w.detach(), false, true, MemTag::kActivation);
      z.set_requires_grad(true);
    }
    SequenceLogprobs r = fused ? linear_sequence_logprobs(x, w, y, cut, {chunk, true})
                               : logits_sequence_logprobs(z, y, cut, {chunk, true});
    r.logps.backward(Tensor::full({2}, 1.0, DType::kF32));
  }
  return a.stats().allocated.peak - base;
}

TEST(SequenceLogprobsMemory, ChunkedPeakDoesNotGrowWithTokensTimesVocab) {
  const int64_t v = 151936, h = 8, chunk = 32;
  const int64_t small = peak_extra(64, v, h, chunk, true);
  const int64_t large = peak_extra(512, v, h, chunk, true);
  // Chunk buffers ([chunk, V] logits and their gradient) and [V, H] scratch gradients, whatever
  // the token count: at most a few KiB more for the [T, H] and [T] tensors.
  EXPECT_LE(large - small, 64 << 10) << small << " -> " << large;
  const int64_t logits_bytes = 512 * v * 4;
  EXPECT_LT(large, logits_bytes / 2) << "chunked peak " << large;
  // The full-logits path needs the [T, V] logits and their gradient.
  const int64_t full = peak_extra(512, v, h, chunk, false);
  EXPECT_GE(full, 2 * logits_bytes);
}

// The same op on a CUDA device equals the CPU path (values and gradients).
TEST(SequenceLogprobsCuda, MatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  std::vector<int32_t> cu;
  const Tensor y = make_targets({19, 1, 33, 7}, 229, &cu);
  const Tensor cut = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  const int64_t t = y.numel();
  const Tensor g = Tensor::from_doubles({0.5, -1.0, 0.25, 2.0}, {4}, DType::kF32);
  std::vector<Tensor> out;
  for (Device dev : {Device::cpu(), Device::cuda(0)}) {
    Tensor x = testing::randn({t, 71}, DType::kF32, 31).to(dev);
    Tensor w = testing::randn({229, 71}, DType::kF32, 32).to(dev);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    SequenceLogprobs r = linear_sequence_logprobs(x, w, y, cut, {16, true});
    r.logps.backward(g.to(dev));
    out.push_back(r.logps.to(Device::cpu()));
    out.push_back(x.grad().to(Device::cpu()));
    out.push_back(w.grad().to(Device::cpu()));
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(testing::all_close(out[3 + i], out[i], 1e-4, 1e-4)) << i;
}

}  // namespace
}  // namespace leantune::kernels
