#include "testing/gradcheck.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/rng.h"

namespace leantune::testing {

namespace {
double contract(const std::vector<Tensor>& outs, const std::vector<Tensor>& w) {
  double l = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!w[k].defined()) continue;
    std::vector<double> o = outs[k].to_f64(), ww = w[k].to_f64();
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * ww[i];
  }
  return l;
}
}  // namespace

::testing::AssertionResult gradcheck(const GradFn& f, const std::vector<Tensor>& inputs0,
                                     const GradcheckOptions& opt) {
  std::vector<Tensor> inputs;
  for (const Tensor& t : inputs0) {
    if (!t.defined() || t.dtype() != DType::kF64) {
      inputs.push_back(t);
      continue;
    }
    Tensor c = t.detach().clone(MemTag::kOther);
    c.set_requires_grad(true);
    inputs.push_back(c);
  }
  std::vector<Tensor> outs = f(inputs);
  Generator gen(opt.seed, RngPurpose::kTest);
  std::vector<Tensor> w, roots, gs;
  for (const Tensor& o : outs) {
    if (!o.defined() || o.dtype() != DType::kF64) {
      w.emplace_back();
      continue;
    }
    Tensor wt = Tensor::empty(o.shape(), DType::kF64, o.device(), MemTag::kOther);
    normal_(wt, gen);
    w.push_back(wt);
    if (o.requires_grad()) {
      roots.push_back(o);
      gs.push_back(wt);
    }
  }
  if (roots.empty()) return ::testing::AssertionFailure() << "no output requires grad";
  backward(roots, gs);

  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor x = inputs[k];
    if (!x.defined() || x.dtype() != DType::kF64) continue;
    Tensor analytic = x.grad();
    const int64_t n = x.numel();
    std::vector<double> ga = analytic.defined() ? analytic.to_f64() : std::vector<double>(n, 0.0);
    std::vector<int64_t> idx;
    if (n <= opt.max_elements) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      Generator pick(opt.seed + k, RngPurpose::kTest);
      for (int64_t i = 0; i < opt.max_elements; ++i)
        idx.push_back(static_cast<int64_t>(pick.next_below(static_cast<uint64_t>(n))));
    }
    for (int64_t i : idx) {
      std::vector<Tensor> in2;
      for (const Tensor& t : inputs) in2.push_back(t.defined() ? t.detach() : t);
      Tensor xp = x.detach().clone(MemTag::kOther);
      double* p = xp.data<double>();
      const double orig = p[i];
      NoGradGuard ng;
      p[i] = orig + opt.eps;
      in2[k] = xp;
      const double lp = contract(f(in2), w);
      p[i] = orig - opt.eps;
      const double lm = contract(f(in2), w);
      const double numeric = (lp - lm) / (2 * opt.eps);
      const double a = ga[i];
      if (!(std::abs(a - numeric) <= opt.atol + opt.rtol * std::abs(numeric)))
        return ::testing::AssertionFailure()
               << "input " << k << " element " << i << ": analytic " << a << ", numeric " << numeric
               << " (diff " << std::abs(a - numeric) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace leantune::testing
