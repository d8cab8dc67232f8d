// The per-op step profile (engine/profile.h): outermost-scope accounting, the "other" row that
// makes the shares add up to the step, nothing recorded outside a step or on another thread, and
// on a GPU (ProfileCuda) event times of real kernels.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/profile.h"
#include "engine/tensor.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using std::chrono::milliseconds;

const OpProfileRow& row(const StepProfile& p, OpKind k) { return p.ops[static_cast<int>(k)]; }

// The JSON's rows and "other" add up to the step, as fractions and as milliseconds.
void expect_consistent(const StepProfile& p) {
  const nlohmann::json j = p.to_json();
  double ms = j["other_ms"].get<double>(), share = j["other_share"].get<double>();
  for (const auto& r : j["ops"]) {
    ms += r["ms"].get<double>();
    share += r["share"].get<double>();
  }
  EXPECT_NEAR(ms, j["step_ms"].get<double>(), 1e-9 * j["step_ms"].get<double>());
  EXPECT_NEAR(share, 1.0, 1e-9);
}

TEST(Profile, OutermostScopeIsTimedAndOtherIsTheRest) {
  StepProfiler prof;
  prof.begin_step(Device::cpu());
  {
    ProfileScope loss(OpKind::kLoss, Device::cpu());
    std::this_thread::sleep_for(milliseconds(30));
    ProfileScope inner(OpKind::kLinearFwd, Device::cpu());  // inside the loss: the loss's time
    std::this_thread::sleep_for(milliseconds(30));
  }
  {
    ProfileScope norm(OpKind::kNorm, Device::cpu());
    std::this_thread::sleep_for(milliseconds(10));
  }
  std::this_thread::sleep_for(milliseconds(20));  // in no op
  prof.end_step();
  const StepProfile& p = prof.profile();
  EXPECT_EQ(p.steps, 1);
  EXPECT_EQ(p.device, "cpu");
  EXPECT_EQ(p.timer, "steady_clock");
  EXPECT_EQ(row(p, OpKind::kLoss).calls, 1);
  EXPECT_GE(row(p, OpKind::kLoss).ms, 60.0);
  EXPECT_EQ(row(p, OpKind::kLinearFwd).calls, 0);
  EXPECT_EQ(row(p, OpKind::kLinearFwd).ms, 0.0);
  EXPECT_EQ(row(p, OpKind::kNorm).calls, 1);
  EXPECT_GE(row(p, OpKind::kNorm).ms, 10.0);
  EXPECT_LT(row(p, OpKind::kNorm).ms, row(p, OpKind::kLoss).ms);
  // Not double counted: the ops fit in the step, and the gap outside them is "other".
  EXPECT_GE(p.step_ms, 90.0);
  EXPECT_LE(p.ops_ms(), p.step_ms);
  EXPECT_GE(p.other_ms(), 20.0);
  expect_consistent(p);
  const std::string t = p.table();
  EXPECT_NE(t.find("other (not in any op)"), std::string::npos) << t;
  EXPECT_NE(t.find("loss"), std::string::npos) << t;
  EXPECT_EQ(t.find("linear fwd"), std::string::npos) << t;  // no calls: no row
}

TEST(Profile, StepsAccumulate) {
  StepProfiler prof;
  for (int s = 0; s < 3; ++s) {
    prof.begin_step(Device::cpu());
    for (int i = 0; i < 2; ++i) {
      ProfileScope a(OpKind::kLinearDx, Device::cpu());
      std::this_thread::sleep_for(milliseconds(2));
    }
    prof.end_step();
  }
  const StepProfile& p = prof.profile();
  EXPECT_EQ(p.steps, 3);
  EXPECT_EQ(row(p, OpKind::kLinearDx).calls, 6);
  EXPECT_GE(row(p, OpKind::kLinearDx).ms, 12.0);
  const nlohmann::json j = p.to_json();
  ASSERT_EQ(j["ops"].size(), 1u);
  EXPECT_EQ(j["ops"][0]["op"], "linear dx");
  EXPECT_NEAR(j["ops"][0]["ms_per_step"].get<double>(), row(p, OpKind::kLinearDx).ms / 3, 1e-9);
  expect_consistent(p);
}

TEST(Profile, NothingRecordedWhenOffCancelledOrOnAnotherThread) {
  StepProfiler prof;
  {
    ProfileScope off(OpKind::kLoss, Device::cpu());  // no step: profiling is off
  }
  prof.begin_step(Device::cpu());
  { ProfileScope cancelled(OpKind::kLoss, Device::cpu()); }
  prof.cancel_step();
  EXPECT_FALSE(prof.in_step());
  EXPECT_EQ(prof.profile().steps, 0);
  EXPECT_EQ(row(prof.profile(), OpKind::kLoss).calls, 0);

  prof.begin_step(Device::cpu());
  std::thread other([] {
    ProfileScope s(OpKind::kComm, Device::cpu());
    std::this_thread::sleep_for(milliseconds(5));
  });
  other.join();
  prof.end_step();
  {
    ProfileScope after(OpKind::kLoss, Device::cpu());  // after end_step: off again
  }
  const StepProfile& p = prof.profile();
  EXPECT_EQ(p.steps, 1);
  for (int k = 0; k < kNumOpKinds; ++k) EXPECT_EQ(p.ops[k].calls, 0) << k;
  EXPECT_DOUBLE_EQ(p.ops_ms(), 0.0);
  expect_consistent(p);
}

TEST(Profile, OneStepAtATime) {
  StepProfiler a, b;
  a.begin_step(Device::cpu());
  EXPECT_THROW(a.begin_step(Device::cpu()), Error);
  EXPECT_THROW(b.begin_step(Device::cpu()), Error);
  a.end_step();
  EXPECT_THROW(a.end_step(), Error);
  b.begin_step(Device::cpu());
  b.end_step();
  EXPECT_EQ(a.profile().steps, 1);
  EXPECT_EQ(b.profile().steps, 1);
}

// Real kernels on a GPU: each timed by an event pair on the current stream, inside the step.
TEST(ProfileCuda, KernelsTimedByEvents) {
  LT_SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  const int64_t t = 2048, in = 1024, out = 1024;
  Tensor x = Tensor::full({t, in}, 0.5, DType::kBF16, d);
  Tensor w = Tensor::full({out, in}, 0.25, DType::kBF16, d);
  Tensor y = Tensor::empty({t, out}, DType::kBF16, d);
  Tensor nw = Tensor::full({out}, 1.0, DType::kBF16, d);
  Tensor ny = Tensor::empty({t, out}, DType::kBF16, d);
  Tensor rstd = Tensor::empty({t}, DType::kF32, d);
  kernels::linear_fwd(x, w, Tensor(), y);  // warm-up: cuBLASLt plan, allocator
  StepProfiler prof;
  for (int s = 0; s < 2; ++s) {
    prof.begin_step(d);
    for (int i = 0; i < 3; ++i) kernels::linear_fwd(x, w, Tensor(), y);
    kernels::rms_norm_fwd(y, nw, 1e-6, ny, rstd, false);
    prof.end_step();
  }
  const StepProfile& p = prof.profile();
  EXPECT_EQ(p.timer, "cuda_events");
  EXPECT_EQ(p.device, "cuda:0");
  EXPECT_EQ(row(p, OpKind::kLinearFwd).calls, 6);
  EXPECT_EQ(row(p, OpKind::kNorm).calls, 2);
  EXPECT_GT(row(p, OpKind::kLinearFwd).ms, 0.0);
  EXPECT_GT(row(p, OpKind::kNorm).ms, 0.0);
  EXPECT_EQ(row(p, OpKind::kLinearFwd).async_calls, 0);
  // Event pairs inside the step's two events on one stream: the ops fit in the step.
  EXPECT_LE(p.ops_ms(), p.step_ms * (1 + 1e-3));
  expect_consistent(p);
  const std::string table = p.table();
  EXPECT_NE(table.find("linear fwd"), std::string::npos) << table;
  EXPECT_NE(table.find("other (not in any op)"), std::string::npos) << table;
}

}  // namespace
}  // namespace leantune
