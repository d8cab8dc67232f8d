// CheckedInt (engine/checked_int.h): exact arithmetic inside int64, OverflowError (an input
// error) at the first operation that would wrap around, never a wrapped value.
#include <gtest/gtest.h>

#include "engine/checked_int.h"

namespace leantune {
namespace {

TEST(CheckedInt, ExactInsideInt64) {
  const CheckedInt a = int64_t{3} << 40;
  EXPECT_EQ((a * 1024 + 7 - 8).get(), (int64_t{3} << 50) - 1);
  EXPECT_EQ((CheckedInt(-9) / 2).get(), -4);
  EXPECT_EQ((-a).get(), -(int64_t{3} << 40));
  EXPECT_LT(CheckedInt(1), CheckedInt(2));
  EXPECT_EQ(std::max(CheckedInt(5), CheckedInt(4)), CheckedInt(5));
  EXPECT_EQ((CheckedInt(INT64_MAX) - 1 + 1).get(), INT64_MAX);
}

TEST(CheckedInt, OverflowIsAnInputError) {
  const CheckedInt big = int64_t{1} << 62;
  auto expect_overflow = [](auto f) {
    try {
      f();
      ADD_FAILURE() << "no overflow";
    } catch (const OverflowError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find("overflows 64-bit integers"), std::string::npos);
    }
  };
  expect_overflow([&] { (void)(big * 2); });
  expect_overflow([&] { (void)(big + big); });
  expect_overflow([&] { (void)(CheckedInt(INT64_MIN) - 1); });
  expect_overflow([&] { (void)(CheckedInt(INT64_MIN) / -1); });
  expect_overflow([&] { (void)(-CheckedInt(INT64_MIN)); });
  // 10^6 x 10^12 tokens x 4 bytes: the estimate's "negative TiB" case.
  expect_overflow([] { (void)(CheckedInt(1000000) * 1000000000000 * 576 * 4); });
}

}  // namespace
}  // namespace leantune
