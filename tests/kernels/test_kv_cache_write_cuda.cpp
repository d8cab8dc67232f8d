// GPU tier for kv_cache_write (kernels/kv_cache_write.cu): the CUDA pool after the write equals
// the CPU pool after the same write, bit for bit, on fresh random inputs: 16-byte rows and odd
// widths (element words), strided rows, guard bands around the pool.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/kv_cache_write.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::Guarded;

const Device kGpu = Device::cuda(0);

struct Case {
  DType dt;
  int64_t pool_rows, width, rows;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  return std::string(dtype_name(p.param.dt)) + "_S" + std::to_string(p.param.pool_rows) + "_W" +
         std::to_string(p.param.width) + "_T" + std::to_string(p.param.rows);
}

class KvCacheWriteCuda : public ::testing::TestWithParam<Case> {};

TEST_P(KvCacheWriteCuda, MatchesCpuBitForBit) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  const Tensor init = testing::randn({c.pool_rows, c.width}, c.dt, 51);
  const Tensor wide = testing::randn({c.width, c.rows}, c.dt, 52);
  std::vector<int64_t> s;
  for (int64_t i = 0; i < c.rows; ++i) s.push_back((i * 5 + 1) % c.pool_rows);
  const Tensor slots = Tensor::from_vector(s, {c.rows});
  Tensor cpu = init.clone();
  kernels::kv_cache_write(cpu, slots, wide.transpose(0, 1));
  Guarded pool({c.pool_rows, c.width}, c.dt, kGpu);
  pool.payload().copy_(init);
  kernels::kv_cache_write(pool.payload(), slots, wide.to(kGpu).transpose(0, 1));
  EXPECT_TRUE(pool.check());
  EXPECT_EQ(pool.payload().to_f64(), cpu.to_f64());
  // Contiguous rows, through the CUDA entry point directly.
  Tensor again = init.to(kGpu);
  kernels::kv_cache_write_cuda(again, slots, wide.transpose(0, 1).contiguous().to(kGpu));
  EXPECT_EQ(again.to_f64(), cpu.to_f64());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvCacheWriteCuda,
    ::testing::Values(Case{DType::kF32, 1, 1, 1}, Case{DType::kBF16, 19, 8, 19},
                      Case{DType::kBF16, 229, 71, 71}, Case{DType::kF16, 64, 128, 13},
                      Case{DType::kF32, 4096, 256, 97}, Case{DType::kF64, 33, 5, 32}),
    case_name);

}  // namespace
}  // namespace leantune
