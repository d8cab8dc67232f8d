// dropout on the host, its autograd node, and the dispatch to CUDA (kernels/dropout.h).
// Each Philox block gives the mask of 4 consecutive elements, so the loop runs over blocks, as
// engine/rng.cpp's fills do; one product and one rounding per element.
#include "kernels/dropout.h"

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cpu_common.h"

namespace leantune::kernels {

namespace {

void check_p(double p) {
  LT_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability ", p, " outside [0, 1]");
}

void apply_cpu(const Tensor& x, const Tensor& y, double p, const PhiloxParams& params) {
  const Tensor xc = ops::contiguous_workspace(x);
  const int64_t n = y.numel();
  const int64_t blocks = (n + 3) / 4;
  const float keep_below = static_cast<float>(1.0 - p);
  const double inv_keep = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  LT_DISPATCH_FLOAT(y.dtype(), T, {
    using A = acc_t<T>;
    const A scale = static_cast<A>(inv_keep);
    const T* px = static_cast<const T*>(xc.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    cpu::parallel_for(blocks, 1024, [&](int64_t blk) {
      const PhiloxBlock r = philox_block(params, static_cast<uint64_t>(blk));
      for (int j = 0; j < 4; ++j) {
        const int64_t i = blk * 4 + j;
        if (i >= n) break;
        const bool keep = philox_uniform(r.w[j]) < keep_below;
        store(py, i, keep ? static_cast<A>(load(px, i)) * scale : A(0));
      }
    });
  });
}

void apply(const char* op, const Tensor& x, const Tensor& y, double p, const PhiloxParams& params) {
  check_p(p);
  LT_CHECK(x.shape() == y.shape() && x.dtype() == y.dtype() && dtype_is_floating(x.dtype()), op,
           ": x ", x.str(), ", y ", y.str());
  LT_CHECK(y.is_contiguous(), op, ": y ", y.str(), " must be contiguous");
  LT_CHECK(x.device() == y.device(), op, ": x ", x.str(), " and y ", y.str(),
           " are on different devices");
  if (y.numel() == 0) return;
  if (y.device().is_cuda()) {
    dropout_apply_cuda(ops::contiguous_workspace(x), y, p, params);
    return;
  }
  apply_cpu(x, y, p, params);
}

// Saves only the Philox coordinates: the mask is regenerated in backward.
class DropoutBackward final : public Node {
 public:
  double p = 0;
  PhiloxParams params{};

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& dy = grads[0];
    if (!dy.defined() || !needs_input_grad(0)) return {Tensor()};
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    dropout_bwd(dy, dx, p, params);
    return {dx};
  }
  std::string name() const override { return "DropoutBackward"; }
};

}  // namespace

void dropout_fwd(const Tensor& x, const Tensor& y, double p, const PhiloxParams& params) {
  apply("dropout_fwd", x, y, p, params);
}

void dropout_bwd(const Tensor& dy, const Tensor& dx, double p, const PhiloxParams& params) {
  apply("dropout_bwd", dy, dx, p, params);
}

Tensor dropout(const Tensor& x, double p, Generator& gen) {
  check_p(p);
  if (p == 0.0) return x;
  const PhiloxParams params = gen.take(x.numel());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dropout_fwd(x.detach(), y, p, params);
  if (node_needed({x})) {
    auto node = std::make_shared<DropoutBackward>();
    node->p = p;
    node->params = params;
    node->set_next_edges({x});
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
