// The harness's runs and comparisons (see harness.h).
#include "backend/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "engine/check.h"
#include "engine/stream.h"
#include "kernels/kernel_test_util.h"

namespace leantune::backend_test {

namespace {

::testing::AssertionResult same_dtype(const Tensor& a, const Tensor& e) {
  if (a.dtype() == e.dtype()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "dtype " << dtype_name(a.dtype()) << " vs " << dtype_name(e.dtype());
}

// ||a - b|| / max(||b||, tiny); NaN when either holds a NaN (the bound check then fails).
double rel_fro(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Environment variables set for the length of a run.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::vector<std::pair<std::string, std::string>>& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
      ::setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace

// Half the spacing of dt's values at magnitude m: the error of a correct rounding into dt.
static double half_ulp(DType dt, double m) {
  if (!(m > 0) || !std::isfinite(m)) return 0.0;
  int bits = 52;
  if (dt == DType::kBF16) bits = 7;
  if (dt == DType::kF16) bits = 10;
  if (dt == DType::kF32) bits = 23;
  return 0.5 * std::ldexp(1.0, static_cast<int>(std::floor(std::log2(m))) - bits);
}

Rule Rule::flash(std::function<Vec()> naive) {
  Rule r;
  r.kind = Kind::kFlash;
  // Evaluated at most once, however many comparisons use it.
  auto cache = std::make_shared<std::optional<Vec>>();
  r.naive = std::make_shared<std::function<Vec()>>([naive = std::move(naive), cache] {
    if (!*cache) *cache = naive();
    return **cache;
  });
  return r;
}

::testing::AssertionResult compare(const Rule& rule, const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(actual.shape()) << " vs " << shape_str(expected.shape());
  switch (rule.kind) {
    case Rule::Kind::kExact: {
      ::testing::AssertionResult d = same_dtype(actual, expected);
      if (!d) return d;
      return testing::all_close(actual, expected, 0.0, 0.0);
    }
    case Rule::Kind::kBits: {
      ::testing::AssertionResult d = same_dtype(actual, expected);
      if (!d) return d;
      const std::vector<uint8_t> a = testing::bytes_of(actual), e = testing::bytes_of(expected);
      const auto diff = std::mismatch(a.begin(), a.end(), e.begin());
      if (diff.first == a.end()) return ::testing::AssertionSuccess();
      return ::testing::AssertionFailure()
             << "bytes differ from byte " << (diff.first - a.begin()) << " of " << a.size();
    }
    case Rule::Kind::kClose:
      return testing::all_close(actual, expected, rule.tol);
    case Rule::Kind::kNorm: {
      const double r = rel_fro(actual.to_f64(), expected.to_f64());
      if (r <= rule.bound) return ::testing::AssertionSuccess();
      return ::testing::AssertionFailure()
             << "relative Frobenius error " << r << " > " << rule.bound;
    }
    case Rule::Kind::kWithin: {
      const Vec a = actual.to_f64(), e = expected.to_f64();
      const double err = kernel_test::max_err(a, e);
      const double bound = rule.bound * std::max(1.0, kernel_test::max_abs_finite(e));
      if (err <= bound) return ::testing::AssertionSuccess();
      return ::testing::AssertionFailure() << "max error " << err << " > " << bound;
    }
    case Rule::Kind::kFlash: {
      LT_CHECK(rule.naive != nullptr, "flash rule without a naive computation");
      const Vec naive = (*rule.naive)();
      LT_CHECK(naive.size() == static_cast<size_t>(expected.numel()), "naive computation of ",
               naive.size(), " values for ", expected.str());
      const Vec ref = expected.to_f64();
      return kernel_test::flash_rule("flash rule", actual.to_f64(), naive, ref,
                                     half_ulp(actual.dtype(), kernel_test::max_abs_finite(ref)));
    }
  }
  return ::testing::AssertionFailure() << "unknown rule";
}

Tensor OpRun::on(const Tensor& host) const { return host.to(dev_, host.dtype(), MemTag::kOther); }

Tensor OpRun::randn(const Shape& s, DType dt, uint64_t seed, double std) const {
  return on(testing::randn(s, dt, seed, Device::cpu(), std));
}

Tensor OpRun::randu(const Shape& s, DType dt, uint64_t seed, double lo, double hi) const {
  return on(testing::randu(s, dt, seed, lo, hi, Device::cpu()));
}

Tensor OpRun::guarded(const Shape& s, DType dt, int64_t guard) {
  guards_.push_back(std::make_shared<testing::Guarded>(s, dt, dev_, guard));
  return guards_.back()->payload();
}

void OpRun::add(const std::string& name, const Tensor& t, Rule rule, bool cross,
                const std::string& as) {
  LT_CHECK(find(name) == nullptr, "output ", name, " recorded twice");
  LT_CHECK(t.defined(), "output ", name, " is undefined");
  const Tensor d = t.detach();
  outputs_.push_back(
      {name, d.to(Device::cpu(), d.dtype(), MemTag::kOther), std::move(rule), cross, as});
}

void OpRun::out(const std::string& name, const Tensor& t, Rule rule) {
  add(name, t, std::move(rule), true, "");
}

void OpRun::out(const std::string& name, double v, Rule rule) {
  out(name, Tensor::from_doubles({v}, {1}, DType::kF64), std::move(rule));
}

void OpRun::keep(const std::string& name, const Tensor& t) {
  add(name, t, Rule::exact(), false, "");
}

void OpRun::same(const std::string& name, const Tensor& t, const std::string& as, Rule rule) {
  LT_CHECK(find(as) != nullptr, "output ", name, " refers to ", as, ", not recorded before it");
  add(name, t, std::move(rule), false, as);
}

void OpRun::same(const std::string& name, double v, const std::string& as, Rule rule) {
  same(name, Tensor::from_doubles({v}, {1}, DType::kF64), as, std::move(rule));
}

void OpRun::expect(const std::string& name, const ::testing::AssertionResult& ok) {
  notes_.push_back({ok ? name : name + ": " + ok.message(), static_cast<bool>(ok)});
}

void OpRun::throws(const std::string& name, const std::function<void()>& f) {
  try {
    f();
  } catch (const Error&) {
    notes_.push_back({name, true});
    return;
  }
  notes_.push_back({name + ": no leantune::Error thrown", false});
}

const OpRun::Output* OpRun::find(const std::string& name) const {
  for (const Output& o : outputs_)
    if (o.name == name) return &o;
  return nullptr;
}

std::vector<std::string> OpRun::own_failures() const {
  std::vector<std::string> f;
  const std::string where = std::string(reference_ ? "reference " : "") + dev_.str() + " run: ";
  for (const Note& n : notes_)
    if (!n.ok) f.push_back(where + n.what);
  for (size_t i = 0; i < guards_.size(); ++i) {
    ::testing::AssertionResult g = guards_[i]->check();
    if (!g) f.push_back(where + "guarded buffer " + std::to_string(i) + ": " + g.message());
  }
  for (const Output& o : outputs_) {
    if (o.as.empty()) continue;
    ::testing::AssertionResult r = compare(o.rule, o.value, find(o.as)->value);
    if (!r) f.push_back(where + o.name + " vs " + o.as + ": " + r.message());
  }
  return f;
}

Tensor perturb(const Tensor& t, bool nan) {
  Vec v = t.to_f64();
  if (v.empty()) return t;
  if (!dtype_is_floating(t.dtype())) {
    for (double& x : v) x = t.dtype() == DType::kBool ? (x == 0 ? 1 : 0) : x + 1;
  } else if (nan) {
    v[v.size() / 2] = std::numeric_limits<double>::quiet_NaN();
  } else {
    double ss = 0;
    size_t n = 0;
    for (double x : v)
      if (std::isfinite(x)) {
        ss += x * x;
        ++n;
      }
    const double rms = n > 0 ? std::sqrt(ss / static_cast<double>(n)) : 0.0;
    const double step = std::max(0.1 * rms, 1.0);
    for (double& x : v)
      x = std::isfinite(x) ? x + 0.1 * std::abs(x) + step : std::isinf(x) ? 0.0 : x;
  }
  return Tensor::from_doubles(v, t.shape(), t.dtype());
}

bool OpRun::catches(const OpRun& ref, const std::string& name, bool nan) const {
  const Output* o = find(name);
  LT_CHECK(o != nullptr, "no output ", name);
  const Tensor bad = perturb(o->value, nan);
  if (o->cross) {
    const Output* r = ref.find(name);
    return r == nullptr || !compare(r->rule, bad, r->value);
  }
  if (!o->as.empty()) return !compare(o->rule, bad, find(o->as)->value);
  for (const Output& s : outputs_)
    if (s.as == name && !compare(s.rule, s.value, bad)) return true;
  return false;
}

void OpRun::smash_guard(size_t i) {
  const Tensor p = guards_.at(i)->payload();
  make_view(p, {1}, {1}, p.offset() - 1).fill_(0.0);
}

OpRun run_entry(const Entry& e, Device dev, bool reference) {
  OpRun r(dev, reference);
  try {
    if (reference) {
      e.body(r);
    } else {
      ScopedEnv env(e.env);
      e.body(r);
    }
    if (dev.is_cuda()) device_synchronize(dev);
  } catch (const std::exception& ex) {
    r.fail(std::string("threw: ") + ex.what());
  }
  return r;
}

std::vector<std::string> compare_runs(const OpRun& ours, const OpRun& ref) {
  std::vector<std::string> f;
  std::set<std::string> seen;
  for (const OpRun::Output& o : ours.outputs()) {
    if (!o.cross) continue;
    seen.insert(o.name);
    const OpRun::Output* r = ref.find(o.name);
    if (r == nullptr || !r->cross) {
      f.push_back(o.name + ": not an output of the reference run");
      continue;
    }
    ::testing::AssertionResult c = compare(r->rule, o.value, r->value);
    if (!c) f.push_back(o.name + ": " + c.message());
  }
  for (const OpRun::Output& r : ref.outputs())
    if (r.cross && !seen.count(r.name))
      f.push_back(r.name + ": an output of the reference run only");
  return f;
}

std::vector<std::string> failures(const OpRun& ours, const OpRun& ref) {
  std::vector<std::string> f = ref.own_failures();
  for (std::string& s : ours.own_failures()) f.push_back(std::move(s));
  for (std::string& s : compare_runs(ours, ref)) f.push_back(std::move(s));
  return f;
}

std::string entry_name(const ::testing::TestParamInfo<Entry>& info) { return info.param.name; }

std::string shape_name(const Shape& s) {
  std::string n;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) n += 'x';
    n += std::to_string(s[i]);
  }
  return n;
}

}  // namespace leantune::backend_test
