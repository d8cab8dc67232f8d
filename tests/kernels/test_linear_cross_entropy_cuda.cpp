// The device memory of linear_cross_entropy (kernels/linear_cross_entropy.cu): the extra memory
// a call takes does not grow with the number of tokens, and a bf16 head's gradient is
// accumulated in place. (Its loss and gradients against the CPU op are rows of the cross-backend
// table: tests/backend/table_losses.cpp.)
#include <gtest/gtest.h>

#include <vector>

#include "engine/allocator.h"
#include "engine/stream.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear_cross_entropy.h"
#include "testing/testing.h"

namespace leantune {
namespace {

const Device kGpu = Device::cuda(0);

// Every third row ignored (so rows are gathered); the others cycle through 0, V-1 and
// pseudo-random ids.
Tensor make_targets(int64_t t, int64_t v) {
  std::vector<int64_t> y(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i)
    y[i] = i % 3 == 2   ? kernels::kIgnoreIndex
           : i % 5 == 0 ? 0
           : i % 5 == 1 ? v - 1
                        : (i * 7919 + 13) % v;
  return Tensor::from_vector(y, {t});
}

// Peak device memory above what the caller holds, for T tokens (a third of them ignored, so rows
// are gathered), with the chunk fixed: must not grow with T beyond the 12 bytes per valid row of
// the row list, targets and per-row losses.
int64_t peak_extra_bytes(int64_t t, int64_t h, int64_t v, int64_t chunk,
                         DType dw_dtype = DType::kF32) {
  Allocator& alloc = allocator(kGpu);
  const Tensor xd = testing::randn({t, h}, DType::kBF16, 861, kGpu);
  const Tensor wd = testing::randn({v, h}, DType::kBF16, 862, kGpu, 0.05);
  const Tensor y = make_targets(t, v);
  Tensor dh = Tensor::empty({t, h}, DType::kBF16, kGpu);
  Tensor dw = Tensor::zeros({v, h}, dw_dtype, kGpu);
  device_synchronize(kGpu);
  const int64_t base = alloc.stats().allocated.current;
  alloc.reset_peak_stats();
  kernels::linear_cross_entropy_fwd_bwd_cuda(xd, wd, y, 1.0, dh, dw, {chunk});
  device_synchronize(kGpu);
  return alloc.stats().allocated.peak - base;
}

TEST(LinearCrossEntropyCudaMemory, PeakExtraDoesNotGrowWithTokens) {
  LT_SKIP_WITHOUT_CUDA();
  // Every third row ignored: 2/3 of T valid, a whole number of full chunks in both runs (the
  // same GEMM shapes, so the same cuBLASLt workspaces).
  const int64_t h = 256, v = 32000, chunk = 512, t_small = 3072, t_large = 15360;
  const int64_t small = peak_extra_bytes(t_small, h, v, chunk);
  const int64_t large = peak_extra_bytes(t_large, h, v, chunk);
  // The chunk's logits dominate: chunk x V bf16 (31 MiB), far below T x V.
  EXPECT_GT(small, 0);
  EXPECT_LE(large - small, (t_large - t_small) * 2 / 3 * 12 + (int64_t{1} << 20))
      << "small " << small << " large " << large;
  EXPECT_LT(large, t_large * v * 2 / 8) << "extra memory is a sizeable part of the full logits";
}

TEST(LinearCrossEntropyCudaMemory, Bf16HeadGradientIsAccumulatedInPlace) {
  LT_SKIP_WITHOUT_CUDA();
  // The head's gradient as linear_cross_entropy holds it (bf16, the weight's dtype): cuBLASLt adds
  // each chunk into it directly. An f32 accumulator would be V x H x 4 = 125 MiB; the extra here
  // is the chunk's logits (8 MiB), gathered rows and cuBLASLt's workspace (<= 32 MiB).
  const int64_t h = 1024, v = 32000;
  const int64_t extra = peak_extra_bytes(768, h, v, 128, DType::kBF16);
  EXPECT_GT(extra, 0);
  EXPECT_LT(extra, v * h * 2) << extra;
}

}  // namespace
}  // namespace leantune
