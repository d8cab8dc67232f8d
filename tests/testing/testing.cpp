// The shared test helpers declared in testing.h: the tolerance tables, seeded random inputs,
// comparisons, guard bands, fixture paths and scratch directories.
#include "testing/testing.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "testing/scratch_root.h"

namespace leantune::testing {

namespace {
// Before any allocator exists (static initialisation, before main): poison blocks in tests, and
// keep the GEMM autotune's choices in memory rather than in the user's cache directory.
const bool g_env = [] {
  ::setenv("LEANTUNE_ALLOC_POISON", "1", 0);
  ::setenv("LEANTUNE_GEMM_AUTOTUNE", "memory", 0);
  return true;
}();
}  // namespace

Tol tol(DType dt) {
  switch (dt) {
    case DType::kF64:
      return {1e-12, 1e-10};
    case DType::kF32:
      return {1e-6, 5e-6};
    case DType::kF16:
      return {1e-5, 1e-3};
    case DType::kBF16:
      return {1e-5, 1e-2};
    default:
      return {0.0, 0.0};
  }
}

namespace {
// The GPU tier's table. elem: elementwise {atol at magnitude 1, rtol} (the loosest of the
// per-op tables the GPU tier had before it was one harness); per_term: the absolute error one
// term adds to a 32/64-bit accumulation; norm: normwise relative; repeat: same operations.
struct BackendRow {
  Tol elem;
  double per_term;
  double norm;
  Tol repeat;
};
BackendRow backend_row(DType dt) {
  switch (dt) {
    case DType::kF64:
      return {{1e-12, 1e-10}, 1e-12, 1e-10, {1e-15, 1e-12}};
    case DType::kF32:
      return {{1e-5, 1e-4}, 2e-6, 2e-5, {1e-7, 2e-6}};
    case DType::kF16:
      return {{2e-3, 5e-3}, 0.0, 1.5e-2, {1e-3, 1e-2}};
    case DType::kBF16:
      return {{1.6e-2, 1.6e-2}, 0.0, 1.5e-2, {1e-3, 1e-2}};
    default:  // integers and bool compare exactly
      return {{0.0, 0.0}, 0.0, 0.0, {0.0, 0.0}};
  }
}
}  // namespace

Tol backend_tol(DType dt, double mag) {
  const Tol t = backend_row(dt).elem;
  return {t.atol * mag, t.rtol};
}

Tol backend_sum_tol(DType dt, double k, double mag) {
  const BackendRow r = backend_row(dt);
  const double kk = std::max(k, 1.0);
  return {mag * std::max(r.elem.atol * std::sqrt(kk), r.per_term * kk), r.elem.rtol};
}

double backend_norm_tol(DType dt) { return backend_row(dt).norm; }

Tol backend_repeat_tol(DType dt, double mag) {
  const Tol t = backend_row(dt).repeat;
  return {t.atol * mag, t.rtol};
}

Tensor randn(const Shape& shape, DType dt, uint64_t seed, Device dev, double std) {
  Tensor t = Tensor::empty(shape, dt, dev, MemTag::kOther);
  Generator g(seed, RngPurpose::kTest);
  normal_(t, g, 0.0, std);
  return t;
}

Tensor randu(const Shape& shape, DType dt, uint64_t seed, double lo, double hi, Device dev) {
  Tensor t = Tensor::empty(shape, dt, dev, MemTag::kOther);
  Generator g(seed, RngPurpose::kTest);
  uniform_(t, g, lo, hi);
  return t;
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol,
                                     double rtol) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(actual.shape()) << " vs " << shape_str(expected.shape());
  std::vector<double> a = actual.to_f64(), e = expected.to_f64();
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bool ok;
    if (std::isnan(a[i]) || std::isnan(e[i]))
      ok = std::isnan(a[i]) && std::isnan(e[i]);
    else if (std::isinf(a[i]) || std::isinf(e[i]))
      ok = a[i] == e[i];
    else {
      const double d = std::abs(a[i] - e[i]);
      ok = d <= atol + rtol * std::abs(e[i]);
      worst = std::max(worst, d);
    }
    if (!ok) {
      ++bad;
      if (first < 0) first = static_cast<int64_t>(i);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << a.size() << " elements differ (atol " << atol << ", rtol " << rtol
         << "); first at " << first << ": " << a[first] << " vs " << e[first] << "; max |diff| "
         << worst;
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, Tol t) {
  return all_close(actual, expected, t.atol, t.rtol);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_f64(), y = b.to_f64();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(x[i] - y[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<uint8_t> v(h.nbytes());
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr(), v.size());
  return v;
}

Guarded::Guarded(const Shape& shape, DType dt, Device dev, int64_t guard) : guard_(guard) {
  const int64_t n = shape_numel(shape);
  whole_ = Tensor::empty({n + 2 * guard}, dt, dev, MemTag::kOther);
  whole_.fill_(-12288.0);
  payload_ = whole_.narrow(0, guard, n).view(shape);
}

::testing::AssertionResult Guarded::check() const {
  const int64_t n = whole_.numel() - 2 * guard_;
  for (int64_t start : {int64_t{0}, guard_ + n}) {
    std::vector<double> v = whole_.narrow(0, start, guard_).to_f64();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != -12288.0)
        return ::testing::AssertionFailure()
               << "guard band overwritten at " << (start + static_cast<int64_t>(i)) << ": " << v[i];
  }
  return ::testing::AssertionSuccess();
}

std::string fixture_path(const std::string& rel) {
  return std::string(LT_SOURCE_DIR) + "/tests/fixtures/" + rel;
}

std::string temp_dir(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string id = info ? std::string(info->test_suite_name()) + "." + info->name() : "anon";
  for (char& c : id)
    if (c == '/') c = '_';
  auto dir = scratch_root("leantune_test_") / (id + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

bool have_cuda() { return cuda_available(); }

}  // namespace leantune::testing
