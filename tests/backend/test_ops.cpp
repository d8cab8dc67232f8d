// The runner of the cross-backend op table (tests/backend/table_*.cpp, harness.h).
//   Ops/BackendOpsCuda.MatchesCpu/<entry>: the GPU tier (label gpu, skipped without a device):
//     each entry on the CPU (the reference) and on CUDA device 0, every output compared.
//   Ops/BackendOpsSelfCheck.CpuAgainstCpu/<entry>: the same entry run twice on the CPU (the
//     reference, then the run that stands where the device run stands: for entries whose
//     reference is computed at float64, the op in its own dtype). Both runs must pass all their
//     checks and agree, and every comparison must be able to fail: each output, given a NaN or
//     moved by 10%, must be caught, and so must an overwritten guard band.
//   BackendHarness.*: the rules, guard bands, throws and run comparisons on small hand-made cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "backend/harness.h"
#include "backend/table.h"
#include "engine/check.h"

namespace leantune::backend_test {
namespace {

const std::vector<Entry>& all_entries() {
  static const std::vector<Entry> all = [] {
    std::vector<Entry> v;
    for (auto group : {engine_op_entries, optim_entries, layer_entries, linear_entries,
                       loss_entries, attention_entries, ring_entries})
      for (Entry& e : group()) v.push_back(std::move(e));
    return v;
  }();
  return all;
}

class BackendOpsCuda : public ::testing::TestWithParam<Entry> {};

TEST_P(BackendOpsCuda, MatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Entry& e = GetParam();
  if (e.skip_on_device) {
    const std::string why = e.skip_on_device();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  const OpRun ref = run_entry(e, Device::cpu(), true);
  const OpRun ours = run_entry(e, Device::cuda(0), false);
  EXPECT_GT(ours.checks(), 0u) << "the device run checked nothing";
  for (const std::string& f : failures(ours, ref)) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOpsCuda, ::testing::ValuesIn(all_entries()), entry_name);

class BackendOpsSelfCheck : public ::testing::TestWithParam<Entry> {};

TEST_P(BackendOpsSelfCheck, CpuAgainstCpu) {
  const Entry& e = GetParam();
  const OpRun ref = run_entry(e, Device::cpu(), true);
  OpRun ours = run_entry(e, Device::cpu(), false);
  ASSERT_GT(ours.checks(), 0u) << "an entry that checks nothing";
  const std::vector<std::string> f = failures(ours, ref);
  for (const std::string& s : f) ADD_FAILURE() << s;
  if (!f.empty()) return;
  for (const OpRun::Output& o : ours.outputs()) {
    if (o.value.numel() == 0) continue;
    for (bool nan : {true, false}) {
      if (nan && !dtype_is_floating(o.value.dtype())) continue;
      EXPECT_TRUE(ours.catches(ref, o.name, nan))
          << o.name << (nan ? " with a NaN" : " moved by 10%") << " still passes its comparison";
    }
  }
  for (size_t i = 0; i < ours.guarded_buffers(); ++i) {
    ours.smash_guard(i);
    EXPECT_FALSE(ours.guard_intact(i)) << "guarded buffer " << i << " overwritten unseen";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOpsSelfCheck, ::testing::ValuesIn(all_entries()), entry_name);

// ---------------------------------------------------------------- the harness itself

TEST(BackendHarness, EntryNamesAreUniqueGtestNames) {
  const std::regex ok("[a-z0-9_]+");
  std::set<std::string> seen;
  for (const Entry& e : all_entries()) {
    EXPECT_TRUE(std::regex_match(e.name, ok)) << e.name;
    EXPECT_TRUE(seen.insert(e.name).second) << "duplicate entry " << e.name;
  }
  EXPECT_GT(seen.size(), 100u);
}

Tensor vals(const Vec& v, DType dt = DType::kF32) {
  return Tensor::from_doubles(v, {static_cast<int64_t>(v.size())}, dt);
}

TEST(BackendHarness, RulesCatchWhatTheyPromise) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // exact: values and dtype; NaN matches only NaN; infinities must agree.
  EXPECT_TRUE(compare(Rule::exact(), vals({1, nan, -inf}), vals({1, nan, -inf})));
  EXPECT_FALSE(compare(Rule::exact(), vals({1, 2}), vals({1, 2.5})));
  EXPECT_FALSE(compare(Rule::exact(), vals({1, 2}), vals({1, 2}, DType::kF64)));
  EXPECT_FALSE(compare(Rule::exact(), vals({1, nan}), vals({1, 2})));
  EXPECT_FALSE(compare(Rule::exact(), vals({1, 2}), vals({1, nan})));
  EXPECT_FALSE(compare(Rule::exact(), vals({inf}), vals({-inf})));
  EXPECT_FALSE(compare(Rule::exact(), vals({1, 2}), vals({1, 2, 3})));
  // bits: -0 and +0 differ.
  EXPECT_TRUE(compare(Rule::exact(), vals({-0.0}), vals({0.0})));
  EXPECT_FALSE(compare(Rule::bits(), vals({-0.0}), vals({0.0})));
  EXPECT_TRUE(compare(Rule::bits(), vals({3.5}), vals({3.5})));
  // close: atol + rtol |expected|.
  const Rule c = Rule::close({0.1, 0.01});
  EXPECT_TRUE(compare(c, vals({10.19}), vals({10.0})));
  EXPECT_FALSE(compare(c, vals({10.21}), vals({10.0})));
  EXPECT_FALSE(compare(c, vals({nan}), vals({1.0})));
  // norm: relative Frobenius; a NaN fails.
  EXPECT_TRUE(compare(Rule::norm(0.01), vals({3.0, 4.03}), vals({3, 4})));
  EXPECT_FALSE(compare(Rule::norm(0.01), vals({3.0, 4.1}), vals({3, 4})));
  EXPECT_FALSE(compare(Rule::norm(0.01), vals({3.0, nan}), vals({3, 4})));
  // within: max error against bound * max(1, max|expected|), -inf rows skipped in the scale.
  EXPECT_TRUE(compare(Rule::within(0.01), vals({-inf, 100.9}), vals({-inf, 100})));
  EXPECT_FALSE(compare(Rule::within(0.01), vals({-inf, 101.1}), vals({-inf, 100})));
  EXPECT_FALSE(compare(Rule::within(0.01), vals({0.0, 100}), vals({-inf, 100})));
  // flash: twice the naive error plus 1e-4 of the magnitude; the naive runs once.
  int calls = 0;
  const Rule f = Rule::flash([&calls] {
    ++calls;
    return Vec{1.0, 2.1};
  });
  EXPECT_TRUE(compare(f, vals({1.0, 2.19}), vals({1, 2})));
  EXPECT_FALSE(compare(f, vals({1.0, 2.21}), vals({1, 2})));
  EXPECT_EQ(calls, 1);
  // flash: the naive's error counts as at least half an ulp of the output dtype. Near 0.05 bf16
  // values are 2^-12 apart: the correctly rounded 205 * 2^-12 passes against an exact naive, the
  // next value up does not.
  const Rule exact_naive = Rule::flash([] { return Vec{0.05}; });
  EXPECT_TRUE(compare(exact_naive, vals({205.0 / 4096}, DType::kBF16), vals({0.05}, DType::kF64)));
  EXPECT_FALSE(compare(exact_naive, vals({206.0 / 4096}, DType::kBF16), vals({0.05}, DType::kF64)));
}

TEST(BackendHarness, RunsCheckGuardsThrowsPropertiesAndTheirOwnOutputs) {
  OpRun r(Device::cpu(), false);
  Tensor y = r.guarded({19}, DType::kF32);
  y.fill_(1.0);
  r.out("y", y, Rule::exact());
  r.same("y_again", y.clone(), "y");
  r.throws("bad view", [&] { (void)y.narrow(0, 10, 19); });
  r.expect("ones", ::testing::AssertionSuccess());
  EXPECT_TRUE(r.own_failures().empty());
  // An output recorded is a copy: later writes to the buffer do not change it.
  y.fill_(2.0);
  EXPECT_EQ(r.find("y")->value.to_f64()[0], 1.0);

  OpRun bad = r;
  bad.throws("no throw", [] {});
  bad.expect("property", ::testing::AssertionFailure() << "broken");
  bad.same("y_off", Tensor::full({19}, 1.5, DType::kF32), "y");
  EXPECT_EQ(bad.own_failures().size(), 3u);
  EXPECT_TRUE(bad.guard_intact(0));
  bad.smash_guard(0);
  EXPECT_FALSE(bad.guard_intact(0));
  EXPECT_EQ(bad.own_failures().size(), 4u);
  EXPECT_THROW(r.same("z", y, "missing"), Error);
}

TEST(BackendHarness, ComparesRunsByNameAndReportsThrows) {
  const Entry e{"toy", [](OpRun& r) {
                  r.out("x", r.randn({7}, DType::kF32, 3), Rule::exact());
                  if (!r.reference()) r.out("extra", 1.0, Rule::exact());
                }};
  const OpRun ref = run_entry(e, Device::cpu(), true);
  const OpRun ours = run_entry(e, Device::cpu(), false);
  const std::vector<std::string> f = compare_runs(ours, ref);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].find("extra"), std::string::npos);
  EXPECT_TRUE(compare_runs(ref, ref).empty());
  EXPECT_TRUE(ours.catches(ref, "x", false));
  EXPECT_TRUE(ours.catches(ref, "x", true));
  // The perturbation: +10% of |x| + max(10% rms, 1); infinities become 0; integers move by one.
  EXPECT_TRUE(compare(Rule::exact(), perturb(vals({0.0, 0.0}), false), vals({1.0, 1.0})));
  EXPECT_TRUE(compare(Rule::close({1e-6, 1e-6}), perturb(vals({30.0, -40.0}), false),
                      vals({30 + 3 + 3.5355339, -40 + 4 + 3.5355339})));
  EXPECT_TRUE(compare(Rule::exact(), perturb(vals({-INFINITY, 2.0}), false), vals({0.0, 3.2})));
  EXPECT_TRUE(
      compare(Rule::exact(), perturb(vals({7, 8}, DType::kI64), false), vals({8, 9}, DType::kI64)));
  EXPECT_TRUE(std::isnan(perturb(vals({1, 2, 3}), true).to_f64()[1]));

  const Entry throwing{"throwing", [](OpRun&) { LT_THROW(ErrorKind::kInput, "boom"); }};
  const std::vector<std::string> t = run_entry(throwing, Device::cpu(), true).own_failures();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_NE(t[0].find("boom"), std::string::npos);
}

TEST(BackendHarness, EnvironmentIsSetForTheNonReferenceRunOnly) {
  ::unsetenv("LT_BACKEND_HARNESS_PROBE");
  const Entry e{"env",
                [](OpRun& r) {
                  const char* v = std::getenv("LT_BACKEND_HARNESS_PROBE");
                  r.out("set", v != nullptr && std::string(v) == "4" ? 1.0 : 0.0, Rule::exact());
                },
                {{"LT_BACKEND_HARNESS_PROBE", "4"}}};
  EXPECT_EQ(run_entry(e, Device::cpu(), false).find("set")->value.item(), 1.0);
  EXPECT_EQ(run_entry(e, Device::cpu(), true).find("set")->value.item(), 0.0);
  EXPECT_EQ(std::getenv("LT_BACKEND_HARNESS_PROBE"), nullptr);
}

}  // namespace
}  // namespace leantune::backend_test
