// GPU tier for vocab_block_softmax (kernels/vocab_block_softmax.cu) against the CPU op on host
// copies of the same fresh random inputs: the merged lse and target logits over blocks, and the
// block gradients (in place), f32 and f64, 1, 19 and 71x229 rows x columns, ignored rows.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/vocab_block_softmax.h"
#include "testing/testing.h"

namespace leantune {
namespace {

const Device kGpu = Device::cuda(0);

class VocabBlockSoftmaxCuda : public ::testing::TestWithParam<DType> {};

TEST_P(VocabBlockSoftmaxCuda, MatchesTheCpuOnFreshInputs) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  const testing::Tol tol = testing::tol(dt);
  for (auto [rows, v, block] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {19, 229, 7}, {71, 229, 229}, {71, 229, 64}}) {
    Tensor z = testing::randn({rows, v}, dt, 29 + rows, Device::cpu(), 3.0);
    std::vector<int64_t> y(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) y[r] = r % 3 == 2 ? kernels::kIgnoreIndex : (r * 53) % v;
    const Tensor tg = Tensor::from_vector(y, {rows});
    const Tensor tgd = tg.to(kGpu);
    Tensor lse = Tensor::full({rows}, -INFINITY, dt), zy = Tensor::zeros({rows}, dt);
    Tensor lsed = lse.to(kGpu), zyd = zy.to(kGpu);
    for (int64_t v0 = 0; v0 < v; v0 += block) {
      const int64_t nb = std::min(block, v - v0);
      Tensor zb = z.narrow(1, v0, nb).contiguous();
      kernels::vocab_block_lse_update(zb, tg, v0, lse, zy);
      kernels::vocab_block_lse_update(zb.to(kGpu), tgd, v0, lsed, zyd);
    }
    EXPECT_TRUE(testing::all_close(lsed.to(Device::cpu()), lse, tol));
    EXPECT_TRUE(testing::all_close(zyd.to(Device::cpu()), zy, 0.0, 0.0));
    for (int64_t v0 = 0; v0 < v; v0 += block) {
      const int64_t nb = std::min(block, v - v0);
      Tensor zb = z.narrow(1, v0, nb).contiguous();
      Tensor zbd = zb.to(kGpu);
      kernels::vocab_block_softmax_grad(zb, tg, v0, lse, 0.5, zb);
      kernels::vocab_block_softmax_grad(zbd, tgd, v0, lse.to(kGpu), 0.5, zbd);
      EXPECT_TRUE(testing::all_close(zbd.to(Device::cpu()), zb, tol))
          << rows << "x" << v << " block " << v0;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, VocabBlockSoftmaxCuda, ::testing::Values(DType::kF32, DType::kF64),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace leantune
