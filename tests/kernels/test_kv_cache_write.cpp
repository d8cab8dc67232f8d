// kv_cache_write (kernels/kv_cache_write.h) on the CPU: every slot named gets its row bit for bit,
// every other pool row keeps its bytes; strided rows; every dtype; slot errors name the position.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/check.h"
#include "kernels/kv_cache_write.h"
#include "testing/testing.h"

namespace leantune {
namespace {

struct Case {
  DType dt;
  int64_t pool_rows, width, rows;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  return std::string(dtype_name(p.param.dt)) + "_S" + std::to_string(p.param.pool_rows) + "_W" +
         std::to_string(p.param.width) + "_T" + std::to_string(p.param.rows);
}

// Slots spread over the pool, in no particular order, distinct.
std::vector<int64_t> spread_slots(int64_t rows, int64_t pool_rows) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i < rows; ++i) s.push_back((i * 7 + 3) % pool_rows);
  return s;
}

class KvCacheWrite : public ::testing::TestWithParam<Case> {};

TEST_P(KvCacheWrite, WritesNamedSlotsAndNothingElse) {
  const Case c = GetParam();
  ASSERT_EQ(c.pool_rows % 7 != 0 || c.rows == 1, true);  // (i * 7 + 3) % S distinct for T <= S
  Tensor pool = testing::randn({c.pool_rows, c.width}, c.dt, 41);
  const std::vector<double> before = pool.to_f64();
  const Tensor rows = testing::randn({c.rows, c.width}, c.dt, 42);
  const std::vector<int64_t> s = spread_slots(c.rows, c.pool_rows);
  kernels::kv_cache_write(pool, Tensor::from_vector(s, {c.rows}), rows);
  std::vector<double> want = before;
  const std::vector<double> r = rows.to_f64();
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.width; ++j) want[s[i] * c.width + j] = r[i * c.width + j];
  EXPECT_EQ(pool.to_f64(), want);
}

TEST_P(KvCacheWrite, StridedRowsAndI32Slots) {
  const Case c = GetParam();
  Tensor pool = Tensor::zeros({c.pool_rows, c.width}, c.dt);
  const Tensor wide = testing::randn({c.width, c.rows}, c.dt, 43);
  const Tensor rows = wide.transpose(0, 1);  // [T, W], strided
  std::vector<int32_t> s;
  for (int64_t x : spread_slots(c.rows, c.pool_rows)) s.push_back(static_cast<int32_t>(x));
  kernels::kv_cache_write(pool, Tensor::from_vector(s, {c.rows}), rows);
  const std::vector<double> p = pool.to_f64(), r = rows.contiguous().to_f64();
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.width; ++j)
      ASSERT_EQ(p[s[i] * c.width + j], r[i * c.width + j]) << i << "," << j;
}

INSTANTIATE_TEST_SUITE_P(Shapes, KvCacheWrite,
                         ::testing::Values(Case{DType::kF32, 1, 1, 1}, Case{DType::kF32, 19, 8, 19},
                                           Case{DType::kBF16, 229, 71, 71},
                                           Case{DType::kF16, 64, 19, 13},
                                           Case{DType::kF64, 33, 5, 32}),
                         case_name);

TEST(KvCacheWriteErrors, SlotOutsideThePoolOrNamedTwice) {
  Tensor pool = Tensor::zeros({8, 4}, DType::kF32);
  const Tensor rows = testing::randn({3, 4}, DType::kF32, 44);
  try {
    kernels::kv_cache_write(pool, Tensor::from_vector<int64_t>({1, 8, 2}, {3}), rows);
    FAIL() << "slot 8 of 8 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("slot 8 at position 1"), std::string::npos) << e.what();
  }
  try {
    kernels::kv_cache_write(pool, Tensor::from_vector<int64_t>({5, 2, 5}, {3}), rows);
    FAIL() << "a slot named twice accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot 5 is named at positions 0 and 2"), std::string::npos)
        << e.what();
  }
  // Nothing was written by the refused calls.
  for (double x : pool.to_f64()) EXPECT_EQ(x, 0.0);
  // Wrong width or dtype is a programming error.
  EXPECT_THROW(kernels::kv_cache_write(pool, Tensor::from_vector<int64_t>({0}, {1}),
                                       testing::randn({1, 3}, DType::kF32, 45)),
               Error);
  EXPECT_THROW(kernels::kv_cache_write(pool, Tensor::from_vector<int64_t>({0}, {1}),
                                       testing::randn({1, 4}, DType::kBF16, 45)),
               Error);
}

}  // namespace
}  // namespace leantune
