// Learning-rate schedules (trainers/common/schedule.h): hand-computed anchors, the errors of
// unknown names and parameters, and every schedule against transformers' get_scheduler.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "testing/testing.h"
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

TEST(LrSchedule, UnknownNamesAndKwargsAreInputErrors) {
  EXPECT_THROW(LrScheduler::make("cosine_annealing", 1, 10, 0, 0), Error);
  EXPECT_THROW(LrScheduler::make("linear", 1, 10, 0, 0, {{"num_cycles", 1}}), Error);
  EXPECT_THROW(LrScheduler::make("cosine_with_min_lr", 1, 10, 0, 0), Error);  // needs one
  EXPECT_THROW(
      LrScheduler::make("cosine_with_min_lr", 1, 10, 0, 0, {{"min_lr", 0.1}, {"min_lr_rate", 0.1}}),
      Error);
  EXPECT_THROW(LrScheduler::make("warmup_stable_decay", 1, 10, 0, 0), Error);
  EXPECT_THROW(LrScheduler::make("cosine_with_min_lr", 0, 10, 0, 0, {{"min_lr", 1e-5}}), Error);
  EXPECT_THROW(LrScheduler::make("polynomial", 1e-8, 10, 0, 0), Error);  // lr_end 1e-7 above
  EXPECT_THROW(LrScheduler::make("cosine", 1, 10, 0, 0, {{"num_cycles", "one"}}), Error);
  EXPECT_THROW(parse_lr_scheduler_kwargs("[1]"), Error);
  EXPECT_EQ(parse_lr_scheduler_kwargs(""), nlohmann::json::object());
}

// Every schedule against transformers' get_scheduler (tests/fixtures/
// gen_trainer_schedule_fixtures.py): the rate of each update and the one after the last.
class LrSchedules : public ::testing::TestWithParam<std::string> {};

const nlohmann::json& lr_fixture() {
  static const nlohmann::json j = nlohmann::json::parse(
      read_text_file(testing::fixture_path("trainer/schedule_cases.json")))["lr_cases"];
  return j;
}

std::vector<std::string> lr_case_names() {
  std::vector<std::string> names;
  for (const auto& c : lr_fixture()) names.push_back(c["name"].get<std::string>());
  return names;
}

TEST_P(LrSchedules, MatchTransformersGetScheduler) {
  nlohmann::json c;
  for (const auto& x : lr_fixture())
    if (x["name"] == GetParam()) c = x;
  ASSERT_FALSE(c.is_null());
  const LrScheduler s =
      LrScheduler::make(c["lr_scheduler_type"].get<std::string>(), c["learning_rate"].get<double>(),
                        c["total_steps"].get<int64_t>(), c["warmup_steps"].get<int64_t>(), 0.0,
                        c["lr_scheduler_kwargs"]);
  const auto lrs = c["lrs"].get<std::vector<double>>();
  for (size_t k = 0; k < lrs.size(); ++k)
    EXPECT_NEAR(s.lr(static_cast<int64_t>(k)), lrs[k], 1e-12 * std::max(1.0, std::abs(lrs[k])))
        << "update " << k;
}

INSTANTIATE_TEST_SUITE_P(Transformers, LrSchedules, ::testing::ValuesIn(lr_case_names()),
                         [](const auto& info) { return info.param; });

// reduce_lr_on_plateau against torch's ReduceLROnPlateau (through transformers' get_scheduler):
// the rate after each evaluation's metric, NaN included; and its state through a checkpoint.
TEST(LrSchedule, ReduceLrOnPlateauMatchesTorch) {
  const nlohmann::json cases = nlohmann::json::parse(
      read_text_file(testing::fixture_path("trainer/schedule_cases.json")))["plateau_cases"];
  ASSERT_GE(cases.size(), 6u);
  for (const auto& c : cases) {
    LrScheduler s = LrScheduler::make("reduce_lr_on_plateau", c["learning_rate"].get<double>(), 100,
                                      0, 0.0, c["lr_scheduler_kwargs"]);
    const auto lrs = c["lrs"].get<std::vector<double>>();
    ASSERT_EQ(lrs.size(), c["metrics"].size());
    for (size_t k = 0; k < lrs.size(); ++k) {
      const nlohmann::json& m = c["metrics"][k];
      s.observe(m.is_null() ? std::nan("") : m.get<double>());
      EXPECT_NEAR(s.lr(static_cast<int64_t>(k)), lrs[k], 1e-15) << c["name"] << " evaluation " << k;
      if (k == lrs.size() / 2) {
        // A resumed run continues from the saved state.
        LrScheduler r = LrScheduler::make("reduce_lr_on_plateau", c["learning_rate"].get<double>(),
                                          100, 0, 0.0, c["lr_scheduler_kwargs"]);
        r.set_state(nlohmann::json::parse(s.state().dump()), "state");
        s = r;
      }
    }
  }
  LrScheduler s = LrScheduler::make("reduce_lr_on_plateau", 1e-3, 10, 0, 0.0);
  EXPECT_THROW(s.set_state({{"lr", "x"}}, "state"), Error);
  EXPECT_THROW(LrScheduler::make("reduce_lr_on_plateau", 1e-3, 10, 0, 0.0, {{"mode", "up"}}),
               Error);
  EXPECT_THROW(LrScheduler::make("reduce_lr_on_plateau", 1e-3, 10, 0, 0.0, {{"factor", 1.0}}),
               Error);
  EXPECT_TRUE(LrScheduler::make("linear", 1e-3, 10, 0, 0.0).state().is_null());
}

}  // namespace
}  // namespace leantune
