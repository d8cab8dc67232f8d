#include "testing/testing.h"

#include "testing/scratch_root.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace leantune::testing {

namespace {
// Before any allocator exists (static initialisation, before main): poison blocks in tests.
const bool g_poison = [] {
  ::setenv("LEANTUNE_ALLOC_POISON", "1", 0);
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
