#include <gtest/gtest.h>

#include <cmath>

#include "engine/check.h"
#include "trainers/common/schedule.h"

namespace leantune {
namespace {

TEST(LrSchedule, LinearWithWarmupHandComputed) {
  // base 1e-3, 10 updates, 2 warmup: 0, 0.5e-3, then (10-k)/8 * 1e-3.
  LrScheduler s = LrScheduler::make("linear", 1e-3, 10, 2, 0.0);
  const double expect[] = {0.0,      0.5e-3, 1e-3,     0.875e-3, 0.75e-3,
                           0.625e-3, 0.5e-3, 0.375e-3, 0.25e-3,  0.125e-3};
  for (int k = 0; k < 10; ++k) EXPECT_NEAR(s.lr(k), expect[k], 1e-15) << k;
  EXPECT_EQ(s.lr(10), 0.0);
}

TEST(LrSchedule, CosineWithWarmupRatioHandComputed) {
  // 20 updates, warmup_ratio 0.1 -> ceil(2.0) = 2 warmup updates.
  LrScheduler s = LrScheduler::make("cosine", 2.0, 20, 0, 0.1);
  EXPECT_EQ(s.warmup_steps, 2);
  EXPECT_DOUBLE_EQ(s.lr(1), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(2), 2.0);     // cos(0)
  EXPECT_NEAR(s.lr(11), 1.0, 1e-12);  // halfway: cos(pi/2)
  EXPECT_NEAR(s.lr(6), 2.0 * 0.5 * (1 + std::cos(M_PI * 4 / 18)), 1e-12);
  EXPECT_NEAR(s.lr(20), 0.0, 1e-12);
}

TEST(LrSchedule, WarmupRatioRoundsUp) {
  EXPECT_EQ(LrScheduler::make("linear", 1, 95, 0, 0.03).warmup_steps, 3);  // ceil(2.85)
  EXPECT_EQ(LrScheduler::make("linear", 1, 95, 5, 0.5).warmup_steps, 5);   // steps win
}

TEST(LrSchedule, ConstantKeepsWarmup) {
  LrScheduler s = LrScheduler::make("constant", 3.0, 10, 3, 0.0);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(1), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(3), 3.0);
  EXPECT_DOUBLE_EQ(s.lr(9), 3.0);
  EXPECT_THROW(LrScheduler::make("polynomial", 1, 10, 0, 0), Error);
}

}  // namespace
}  // namespace leantune
