// The device scratch of the quantized linear products (kernels/quant.cu): one buffer, the size
// of the largest weight dequantized, released on request. (Dequantization and the products
// against the host are rows of the cross-backend table: tests/backend/table_linear.cpp.)
#include <gtest/gtest.h>

#include "engine/stream.h"
#include "kernels/quant.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using kernels::Nf4Weight;
using testing::randn;

const Device kGpu = Device::cuda(0);

TEST(QuantWorkspaceCuda, OneScratchOfTheLargestWeight) {
  LT_SKIP_WITHOUT_CUDA();
  kernels::release_quant_workspace(kGpu);
  const Nf4Weight a = kernels::nf4_quantize(randn({96, 200}, DType::kF32, 121), true).to(kGpu);
  const Nf4Weight b = kernels::nf4_quantize(randn({200, 64}, DType::kF32, 122), true).to(kGpu);
  Tensor x = randn({4, 200}, DType::kBF16, 123, kGpu),
         y = Tensor::empty({4, 96}, DType::kBF16, kGpu);
  Tensor x2 = randn({4, 64}, DType::kBF16, 124, kGpu),
         y2 = Tensor::empty({4, 200}, DType::kBF16, kGpu);
  kernels::nf4_linear_fwd(x, a, Tensor(), y);
  kernels::nf4_linear_fwd(x2, b, Tensor(), y2);
  EXPECT_EQ(kernels::quant_workspace_bytes(kGpu), 96 * 200 * 2);
  kernels::nf4_linear_bwd(y, a, Tensor::empty({4, 200}, DType::kBF16, kGpu), Tensor());
  EXPECT_EQ(kernels::quant_workspace_bytes(kGpu), 96 * 200 * 2);
  device_synchronize(kGpu);
  kernels::release_quant_workspace(kGpu);
  EXPECT_EQ(kernels::quant_workspace_bytes(kGpu), 0);
}

}  // namespace
}  // namespace leantune
