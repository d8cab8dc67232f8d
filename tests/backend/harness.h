// The cross-backend op harness (like ggml's test-backend-ops). An Entry is one op at one dtype
// and shape: a body that makes its inputs (fresh, seeded random values drawn on the host), runs
// the op on the device of an OpRun and records what it produced. The GPU tier runs every entry
// twice, on the CPU (the reference) and on a CUDA device, and compares the two runs output by
// output under the rule each output names; the tolerances come from the one table in
// tests/testing (backend_tol and its siblings). Besides cross-backend outputs a run records
// outputs compared with another output of the same run (in place against out of place, host
// against device ids), properties, calls that must throw, and guard bands around the buffers a
// kernel writes into, all checked for each run.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "testing/testing.h"

namespace leantune::backend_test {

using Vec = std::vector<double>;

// How an output is compared with the output it stands against. A NaN on one side only, or
// infinities that differ, fail under every rule; shapes must match.
struct Rule {
  enum class Kind {
    kExact,   // equal values (and dtypes)
    kBits,    // equal bytes (and dtypes)
    kClose,   // |a - b| <= tol.atol + tol.rtol |b| elementwise
    kNorm,    // ||a - b|| / ||b|| <= bound (Frobenius)
    kWithin,  // max|a - b| <= bound * max(1, max|b|) over the finite elements of b
    kFlash,   // flash-attention's rule against the naive same-dtype computation
  };
  Kind kind = Kind::kExact;
  testing::Tol tol{0.0, 0.0};
  double bound = 0.0;
  std::shared_ptr<std::function<Vec()>> naive;  // kFlash: evaluated once, when compared

  static Rule exact() { return {}; }
  static Rule bits() { return {Kind::kBits, {0.0, 0.0}, 0.0, nullptr}; }
  static Rule close(testing::Tol t) { return {Kind::kClose, t, 0.0, nullptr}; }
  static Rule norm(double bound) { return {Kind::kNorm, {0.0, 0.0}, bound, nullptr}; }
  static Rule within(double bound) { return {Kind::kWithin, {0.0, 0.0}, bound, nullptr}; }
  // max|ours - ref| <= 2 max|naive - ref| + 1e-4 max|ref| (hopper/test_flash_attn.py), with
  // naive the same computation in the input dtype, rounded where PyTorch rounds. The naive's
  // error counts as at least half an ulp of the output's dtype at max|ref|, the error of a
  // correct rounding: over a handful of outputs (linear_cross_entropy's 1x8x5 row has 8) the
  // naive's largest error is a single rounding draw, and an output no worse than one ulp off
  // must not fail on that draw. Over large outputs the naive's error exceeds it anyway.
  static Rule flash(std::function<Vec()> naive);
};

// actual (the run under test) against expected (the reference) under rule.
::testing::AssertionResult compare(const Rule& rule, const Tensor& actual, const Tensor& expected);

// One run of an entry on one device.
class OpRun {
 public:
  OpRun(Device dev, bool reference) : dev_(dev), reference_(reference) {}

  Device dev() const { return dev_; }
  bool cuda() const { return dev_.is_cuda(); }
  // The CPU side of the GPU tier; an entry may compute its reference at another precision.
  bool reference() const { return reference_; }

  // A copy of a host tensor on this run's device (a copy on the CPU too: no run aliases the
  // tensor it was given).
  Tensor on(const Tensor& host) const;
  Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) const;
  Tensor randu(const Shape& s, DType dt, uint64_t seed, double lo, double hi) const;
  // A buffer on this run's device between guard bands of sentinels, checked after the run.
  Tensor guarded(const Shape& s, DType dt, int64_t guard = 64);

  // Compared with the output of the same name of the other run, under the reference's rule.
  void out(const std::string& name, const Tensor& t, Rule rule);
  void out(const std::string& name, double v, Rule rule);
  // Kept for same() only: the device's variants of a call against its plain call.
  void keep(const std::string& name, const Tensor& t);
  // Compared with output `as` of this run.
  void same(const std::string& name, const Tensor& t, const std::string& as,
            Rule rule = Rule::exact());
  void same(const std::string& name, double v, const std::string& as, Rule rule = Rule::exact());
  // A property of this run.
  void expect(const std::string& name, const ::testing::AssertionResult& ok);
  // f must throw leantune::Error.
  void throws(const std::string& name, const std::function<void()>& f);

  struct Output {
    std::string name;
    Tensor value;  // a contiguous host copy
    Rule rule;
    bool cross;      // compared with the other run's output of the same name
    std::string as;  // compared with this run's output `as` (when not empty)
  };
  const std::vector<Output>& outputs() const { return outputs_; }
  const Output* find(const std::string& name) const;
  // What went wrong inside this run: properties, throws, guard bands, outputs of the same run.
  std::vector<std::string> own_failures() const;
  // Number of checks this run recorded (outputs, properties, throws, guarded buffers).
  size_t checks() const { return outputs_.size() + notes_.size() + guards_.size(); }
  void fail(const std::string& what) { notes_.push_back({what, false}); }
  // Whether output `name`, changed by perturb(), fails its comparison: with ref's output of the
  // same name, with the output it is the same as, or (a kept output) for some output compared
  // with it.
  bool catches(const OpRun& ref, const std::string& name, bool nan) const;
  // Overwrites the first guard band of guarded buffer i (the self-check of the band checks).
  void smash_guard(size_t i);
  bool guard_intact(size_t i) const { return static_cast<bool>(guards_.at(i)->check()); }
  size_t guarded_buffers() const { return guards_.size(); }

 private:
  void add(const std::string& name, const Tensor& t, Rule rule, bool cross, const std::string& as);
  struct Note {
    std::string what;
    bool ok;
  };
  Device dev_;
  bool reference_;
  std::vector<Output> outputs_;
  std::vector<Note> notes_;
  std::vector<std::shared_ptr<testing::Guarded>> guards_;
};

// One row of the table.
struct Entry {
  std::string name;                  // op_dir_dtype_shape: a gtest parameter name
  std::function<void(OpRun&)> body;  // makes the inputs, runs the op on run.dev(), records
  std::vector<std::pair<std::string, std::string>> env = {};  // set around non-reference runs
  // GPU tier: a reason to skip the entry on the device ("" or unset: run it), e.g. a library
  // the device path needs and the machine lacks.
  std::function<std::string()> skip_on_device = {};
};

// An output changed so that its comparison must fail: `nan` puts a NaN in the middle element
// (floating outputs); otherwise every finite element moves up by 10% of its magnitude plus 10% of
// the output's rms (at least 1), infinities become 0, and integers move by one (bools flip).
Tensor perturb(const Tensor& t, bool nan);

// Runs an entry on dev; an exception out of the body is recorded as a failure of the run.
OpRun run_entry(const Entry& e, Device dev, bool reference);
// The cross-backend comparison: every output of `ours` against the output of the same name of
// `ref` (the sets of names must agree), under ref's rule.
std::vector<std::string> compare_runs(const OpRun& ours, const OpRun& ref);
// Everything the two runs got wrong: each run's own failures, then the comparison.
std::vector<std::string> failures(const OpRun& ours, const OpRun& ref);

std::string entry_name(const ::testing::TestParamInfo<Entry>& info);

// Small helpers shared by the table files.
std::string shape_name(const Shape& s);  // "71x229"
inline std::string dt_name(DType dt) { return dtype_name(dt); }
// The dtype of statistics (lse, rstd, losses) of a dtype's op: f64 for f64, else f32.
inline DType stat_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

}  // namespace leantune::backend_test
