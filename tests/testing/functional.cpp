// Forward and backward of the test-only fn:: ops (see functional.h).
#include "testing/functional.h"

#include <functional>

namespace leantune::fn {

using ops::Unary;

Tensor reduce_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t n = shape_numel(shape);
  if (n == 1) return ops::sum(g).to(g.dtype()).reshape(shape);
  return ops::sum_dim(g.reshape({-1, n}), 0).reshape(shape);
}

namespace {
// A node whose backward is a closure over saved tensors.
class LambdaBackward final : public Node {
 public:
  using Fn = std::function<std::vector<Tensor>(const Tensor& g, const std::vector<Tensor>& saved)>;
  LambdaBackward(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> s;
    for (auto& t : saved) s.push_back(t.unpack());
    return fn_(grads[0], s);
  }
  std::string name() const override { return name_; }
  void release_saved() override {
    for (auto& t : saved) t.reset();
  }
  std::vector<SavedTensor> saved;

 private:
  std::string name_;
  Fn fn_;
};

Tensor record(Tensor out, const std::vector<Tensor>& inputs, const std::vector<Tensor>& to_save,
              std::string name, LambdaBackward::Fn fn) {
  if (!node_needed(inputs)) return out;
  auto node = std::make_shared<LambdaBackward>(std::move(name), std::move(fn));
  node->set_next_edges(inputs);
  for (const Tensor& t : to_save) node->saved.emplace_back(t);
  set_history(out, node);
  return out;
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Shape as = a.shape(), bs = b.shape();
  return record(ops::add(a, b), {a, b}, {}, "AddBackward",
                [as, bs](const Tensor& g, const std::vector<Tensor>&) {
                  return std::vector<Tensor>{reduce_to(g, as), reduce_to(g, bs)};
                });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Shape as = a.shape(), bs = b.shape();
  return record(ops::sub(a, b), {a, b}, {}, "SubBackward",
                [as, bs](const Tensor& g, const std::vector<Tensor>&) {
                  return std::vector<Tensor>{reduce_to(g, as), reduce_to(ops::scale(g, -1.0), bs)};
                });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Shape as = a.shape(), bs = b.shape();
  return record(ops::mul(a, b), {a, b}, {a, b}, "MulBackward",
                [as, bs](const Tensor& g, const std::vector<Tensor>& s) {
                  Tensor ga = ops::mul(g, s[1]);
                  Tensor gb = ops::mul(g, s[0]);
                  return std::vector<Tensor>{reduce_to(ga, as), reduce_to(gb, bs)};
                });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Shape as = a.shape(), bs = b.shape();
  Tensor out = ops::div(a, b);
  return record(out, {a, b}, {b, out}, "DivBackward",
                [as, bs](const Tensor& g, const std::vector<Tensor>& s) {
                  Tensor ga = ops::div(g, s[0]);
                  // d(a/b)/db = -out/b
                  Tensor gb = ops::scale(ops::mul(ga, s[1]), -1.0);
                  return std::vector<Tensor>{reduce_to(ga, as), reduce_to(gb, bs)};
                });
}

Tensor neg(const Tensor& a) { return scale(a, -1.0); }

Tensor scale(const Tensor& a, double s) {
  return record(ops::scale(a, s), {a}, {}, "ScaleBackward",
                [s](const Tensor& g, const std::vector<Tensor>&) {
                  return std::vector<Tensor>{ops::scale(g, s)};
                });
}

Tensor add_scalar(const Tensor& a, double s) {
  return record(ops::affine(a, 1.0, s), {a}, {}, "AddScalarBackward",
                [](const Tensor& g, const std::vector<Tensor>&) { return std::vector<Tensor>{g}; });
}

Tensor exp(const Tensor& a) {
  Tensor out = ops::unary(a, Unary::kExp);
  return record(out, {a}, {out}, "ExpBackward", [](const Tensor& g, const std::vector<Tensor>& s) {
    return std::vector<Tensor>{ops::mul(g, s[0])};
  });
}

Tensor log(const Tensor& a) {
  return record(ops::unary(a, Unary::kLog), {a}, {a}, "LogBackward",
                [](const Tensor& g, const std::vector<Tensor>& s) {
                  return std::vector<Tensor>{ops::div(g, s[0])};
                });
}

Tensor sigmoid(const Tensor& a) {
  Tensor out = ops::unary(a, Unary::kSigmoid);
  return record(out, {a}, {out}, "SigmoidBackward",
                [](const Tensor& g, const std::vector<Tensor>& s) {
                  // s' = s (1 - s)
                  Tensor d = ops::mul(s[0], ops::affine(s[0], -1.0, 1.0));
                  return std::vector<Tensor>{ops::mul(g, d)};
                });
}

Tensor log_sigmoid(const Tensor& a) {
  return record(ops::unary(a, Unary::kLogSigmoid), {a}, {a}, "LogSigmoidBackward",
                [](const Tensor& g, const std::vector<Tensor>& s) {
                  // d/dx log sigmoid(x) = 1 - sigmoid(x) = sigmoid(-x)
                  Tensor d = ops::unary(ops::scale(s[0], -1.0), Unary::kSigmoid);
                  return std::vector<Tensor>{ops::mul(g, d)};
                });
}

Tensor tanh(const Tensor& a) {
  Tensor out = ops::unary(a, Unary::kTanh);
  return record(out, {a}, {out}, "TanhBackward", [](const Tensor& g, const std::vector<Tensor>& s) {
    Tensor d = ops::affine(ops::unary(s[0], Unary::kSquare), -1.0, 1.0);
    return std::vector<Tensor>{ops::mul(g, d)};
  });
}

namespace {
// mask[i] = pred(x[i]) ? 1 : 0 in x's dtype, computed on the host values.
Tensor mask_of(const Tensor& x, const std::function<bool(double)>& pred) {
  std::vector<double> v = x.to_f64();
  for (double& e : v) e = pred(e) ? 1.0 : 0.0;
  return Tensor::from_doubles(v, x.shape(), x.dtype(), x.device(), MemTag::kActivation);
}
Tensor mask_of2(const Tensor& a, const Tensor& b, const std::function<bool(double, double)>& pred) {
  std::vector<double> va = a.to_f64(), vb = b.to_f64();
  LT_CHECK(va.size() == vb.size(), "minimum/maximum need equal shapes");
  for (size_t i = 0; i < va.size(); ++i) va[i] = pred(va[i], vb[i]) ? 1.0 : 0.0;
  return Tensor::from_doubles(va, a.shape(), a.dtype(), a.device(), MemTag::kActivation);
}
}  // namespace

Tensor relu(const Tensor& a) {
  return record(
      ops::unary(a, Unary::kRelu), {a}, {a}, "ReluBackward",
      [](const Tensor& g, const std::vector<Tensor>& s) {
        return std::vector<Tensor>{ops::mul(g, mask_of(s[0], [](double v) { return v > 0; }))};
      });
}

Tensor square(const Tensor& a) {
  return record(ops::unary(a, Unary::kSquare), {a}, {a}, "SquareBackward",
                [](const Tensor& g, const std::vector<Tensor>& s) {
                  return std::vector<Tensor>{ops::mul(g, ops::scale(s[0], 2.0))};
                });
}

Tensor clamp(const Tensor& a, double lo, double hi) {
  std::vector<double> v = a.to_f64();
  for (double& e : v) e = std::min(std::max(e, lo), hi);
  Tensor out = Tensor::from_doubles(v, a.shape(), a.dtype(), a.device(), MemTag::kActivation);
  return record(out, {a}, {a}, "ClampBackward",
                [lo, hi](const Tensor& g, const std::vector<Tensor>& s) {
                  Tensor m = mask_of(s[0], [lo, hi](double e) { return e >= lo && e <= hi; });
                  return std::vector<Tensor>{ops::mul(g, m)};
                });
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor ma = mask_of2(a, b, [](double x, double y) { return x <= y; });
  Tensor out = ops::add(ops::mul(a, ma), ops::mul(b, ops::affine(ma, -1.0, 1.0)));
  return record(
      out, {a, b}, {ma}, "MinimumBackward", [](const Tensor& g, const std::vector<Tensor>& s) {
        return std::vector<Tensor>{ops::mul(g, s[0]), ops::mul(g, ops::affine(s[0], -1.0, 1.0))};
      });
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor ma = mask_of2(a, b, [](double x, double y) { return x >= y; });
  Tensor out = ops::add(ops::mul(a, ma), ops::mul(b, ops::affine(ma, -1.0, 1.0)));
  return record(
      out, {a, b}, {ma}, "MaximumBackward", [](const Tensor& g, const std::vector<Tensor>& s) {
        return std::vector<Tensor>{ops::mul(g, s[0]), ops::mul(g, ops::affine(s[0], -1.0, 1.0))};
      });
}

Tensor sum(const Tensor& a) {
  Shape as = a.shape();
  DType dt = a.dtype();
  Tensor out = ops::sum(a).to(dt);
  return record(out, {a}, {}, "SumBackward", [as, dt](const Tensor& g, const std::vector<Tensor>&) {
    Tensor gi = Tensor::empty(as, dt, g.device());
    gi.fill_(g.item());
    return std::vector<Tensor>{gi};
  });
}

Tensor mean(const Tensor& a) {
  const int64_t n = a.numel();
  LT_CHECK(n > 0, "mean of an empty tensor");
  return scale(sum(a), 1.0 / static_cast<double>(n));
}

Tensor sum_dim(const Tensor& a, int64_t dim, bool keepdim) {
  Shape as = a.shape();
  const int64_t nd = a.dim();
  const int64_t d = dim < 0 ? dim + nd : dim;
  return record(ops::sum_dim(a, d, keepdim), {a}, {}, "SumDimBackward",
                [as, d](const Tensor& g, const std::vector<Tensor>&) {
                  // Broadcast g back along d: out[.., k, ..] = g[.., ..].
                  Shape keep = as;
                  keep[d] = 1;
                  Tensor gk = g.reshape(keep).contiguous();
                  Tensor gi = Tensor::empty(as, g.dtype(), g.device());
                  for (int64_t k = 0; k < as[d]; ++k) gi.narrow(d, k, 1).copy_(gk);
                  return std::vector<Tensor>{gi};
                });
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return record(ops::matmul(a, b, ta, tb), {a, b}, {a, b}, "MatmulBackward",
                [ta, tb](const Tensor& g, const std::vector<Tensor>& s) {
                  const Tensor& A = s[0];
                  const Tensor& B = s[1];
                  // C = op(A) op(B). dop(A) = G op(B)^T, dop(B) = op(A)^T G.
                  Tensor ga = ta ? ops::matmul(B, g, tb, true) : ops::matmul(g, B, false, !tb);
                  Tensor gb = tb ? ops::matmul(g, A, true, ta) : ops::matmul(A, g, !ta, false);
                  return std::vector<Tensor>{ga, gb};
                });
}

Tensor softmax_last(const Tensor& a) {
  Tensor out = ops::softmax_last(a);
  return record(out, {a}, {out}, "SoftmaxBackward",
                [](const Tensor& g, const std::vector<Tensor>& s) {
                  // dx = y * (g - sum(g*y, -1))
                  Tensor gy = ops::mul(g, s[0]);
                  Tensor dot = ops::sum_dim(gy, -1, true);
                  const int64_t n = s[0].size(-1);
                  Tensor dotb = Tensor::empty(s[0].shape(), s[0].dtype(), s[0].device());
                  for (int64_t k = 0; k < n; ++k) dotb.narrow(-1, k, 1).copy_(dot);
                  return std::vector<Tensor>{ops::mul(s[0], ops::sub(g, dotb))};
                });
}

Tensor log_softmax_last(const Tensor& a) {
  Tensor out = ops::log_softmax_last(a);
  return record(out, {a}, {out}, "LogSoftmaxBackward",
                [](const Tensor& g, const std::vector<Tensor>& s) {
                  // dx = g - softmax * sum(g, -1)
                  Tensor sm = ops::unary(s[0], Unary::kExp);
                  Tensor gs = ops::sum_dim(g, -1, true);
                  const int64_t n = s[0].size(-1);
                  Tensor gsb = Tensor::empty(s[0].shape(), s[0].dtype(), s[0].device());
                  for (int64_t k = 0; k < n; ++k) gsb.narrow(-1, k, 1).copy_(gs);
                  return std::vector<Tensor>{ops::sub(g, ops::mul(sm, gsb))};
                });
}

Tensor cat0(const std::vector<Tensor>& parts) {
  LT_CHECK(!parts.empty(), "cat0 of nothing");
  Shape s = parts[0].shape();
  int64_t rows = 0;
  std::vector<int64_t> sizes;
  for (const Tensor& p : parts) {
    LT_CHECK(p.dim() == static_cast<int64_t>(s.size()) && p.dtype() == parts[0].dtype(),
             "cat0: ", p.str(), " vs ", parts[0].str());
    for (size_t i = 1; i < s.size(); ++i) LT_CHECK(p.shape()[i] == s[i], "cat0 shapes differ");
    sizes.push_back(p.size(0));
    rows += p.size(0);
  }
  s[0] = rows;
  Tensor out = Tensor::empty(s, parts[0].dtype(), parts[0].device());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    out.narrow(0, at, p.size(0)).copy_(p.detach());
    at += p.size(0);
  }
  return record(out, parts, {}, "Cat0Backward",
                [sizes](const Tensor& g, const std::vector<Tensor>&) {
                  std::vector<Tensor> r;
                  int64_t off = 0;
                  for (int64_t n : sizes) {
                    r.push_back(g.narrow(0, off, n).contiguous());
                    off += n;
                  }
                  return r;
                });
}

}  // namespace leantune::fn
