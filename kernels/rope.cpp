// rope: rotary position embedding, Hugging Face's rotate_half convention.
//   x:[T,N,D] (N heads, D even; any shape [T, ..., D]), position_ids:[T] i32|i64 (host for the
//   CPU path), inv_freq:[D/2] f32 (f64 for f64 x) -> y like x (contiguous; y may alias x).
//   angle = pos * inv_freq[i] formed in f32 like transformers' f32 matmul (f64 for f64 x);
//   y[i] = x[i] c - x[i+D/2] s,  y[i+D/2] = x[i+D/2] c + x[i] s  (s negated when inverse).
// The CPU path computes cos/sin once per token (D/2 values) and reuses them for all heads.
// Backward is the inverse rotation of dy; saved: position_ids and the [D/2] inv_freq table.
// rope_inv_freq reproduces transformers' rope init functions in float32 arithmetic:
//   default: inv = 1 / theta^(f32(2i) / D) (a float32 power of a float32 base);
//   linear:  inv / factor;
//   llama3:  wavelen = 2pi/inv; wavelen > orig/low -> inv/factor; wavelen < orig/high -> inv;
//            otherwise (1-s) * inv/factor + s * inv with s = (orig/wavelen - low)/(high - low).
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/autograd.h"
#include "engine/cpu_kernels.h"
#include "engine/ops.h"

namespace leantune::kernels {

using cpu::acc_t;
using cpu::load;
using cpu::parallel_for;
using cpu::store;

namespace {

DType table_dtype(DType x) { return x == DType::kF64 ? DType::kF64 : DType::kF32; }

// The [D/2] table for x's dtype and device.
Tensor inv_freq_tensor(const RopeConfig& cfg, const Tensor& x) {
  return Tensor::from_doubles(rope_inv_freq(cfg), {cfg.head_dim / 2}, table_dtype(x.dtype()),
                              x.device(), MemTag::kWorkspace);
}

class RopeBackward final : public Node {
 public:
  SavedTensor position_ids, inv_freq;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined() || !needs_input_grad(0)) return {Tensor()};
    Tensor dy = grads[0];
    const Tensor inv = inv_freq.unpack();
    const DType want = inv.dtype() == DType::kF64 ? DType::kF64 : dy.dtype();
    if (dy.dtype() != want) dy = dy.to(want);
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    rope_apply(dy, position_ids.unpack(), inv, /*inverse=*/true, dx);
    return {dx};
  }
  std::string name() const override { return "RopeBackward"; }
  void release_saved() override {
    position_ids.reset();
    inv_freq.reset();
  }
};

}  // namespace

std::vector<double> rope_inv_freq(const RopeConfig& cfg) {
  LT_CHECK(cfg.head_dim > 0 && cfg.head_dim % 2 == 0, "rope: head_dim ", cfg.head_dim,
           " must be positive and even");
  const std::string& type = cfg.scaling_type;
  LT_CHECK_INPUT(type.empty() || type == "default" || type == "linear" || type == "llama3",
                 "rope_scaling type \"", type,
                 "\" is not supported (supported: default, linear, llama3)");
  const int64_t half = cfg.head_dim / 2;
  const float base = static_cast<float>(cfg.theta);
  const float dim = static_cast<float>(cfg.head_dim);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / dim;
    // torch's pow of two float32 operands; double pow rounded once is the correctly rounded
    // float32 result, which is what a <1 ulp float32 pow returns for these arguments.
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv[i] = 1.0f / p;
  }
  if (type == "linear") {
    LT_CHECK_INPUT(cfg.factor > 0, "rope_scaling factor ", cfg.factor, " must be positive");
    const float f = static_cast<float>(cfg.factor);
    for (float& v : inv) v = v / f;
  } else if (type == "llama3") {
    LT_CHECK_INPUT(
        cfg.factor > 0 && cfg.high_freq_factor != cfg.low_freq_factor && cfg.low_freq_factor > 0 &&
            cfg.high_freq_factor > 0 && cfg.original_max_position_embeddings > 0,
        "rope_scaling llama3: factor ", cfg.factor, ", low_freq_factor ", cfg.low_freq_factor,
        ", high_freq_factor ", cfg.high_freq_factor, ", original_max_position_embeddings ",
        cfg.original_max_position_embeddings, " are not valid");
    const float factor = static_cast<float>(cfg.factor);
    const float lo = static_cast<float>(cfg.low_freq_factor);
    const float band = static_cast<float>(cfg.high_freq_factor - cfg.low_freq_factor);
    const float old_len = static_cast<float>(cfg.original_max_position_embeddings);
    // Python-side doubles, compared against float32 tensors after conversion to float32.
    const float low_wavelen = static_cast<float>(
        static_cast<double>(cfg.original_max_position_embeddings) / cfg.low_freq_factor);
    const float high_wavelen = static_cast<float>(
        static_cast<double>(cfg.original_max_position_embeddings) / cfg.high_freq_factor);
    const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
    for (float& v : inv) {
      // torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar.
      const float wavelen = (1.0f / v) * two_pi;
      const float scaled = wavelen > low_wavelen ? v / factor : v;
      const float s = ((1.0f / wavelen) * old_len - lo) / band;
      const float smoothed = (1.0f - s) * scaled / factor + s * scaled;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      v = medium ? smoothed : scaled;
    }
  }
  return std::vector<double>(inv.begin(), inv.end());
}

void rope_apply(const Tensor& x, const Tensor& position_ids, const Tensor& inv_freq, bool inverse,
                const Tensor& y) {
  LT_CHECK(x.dim() >= 2 && dtype_is_floating(x.dtype()), "rope: x ", x.str(),
           " must be [T, ..., D] float");
  const int64_t t = x.size(0), d = x.size(-1), half = d / 2;
  LT_CHECK(d % 2 == 0 && inv_freq.numel() == half && inv_freq.dtype() == table_dtype(x.dtype()),
           "rope: x ", x.str(), " needs an even head_dim and inv_freq [", half, "] ",
           dtype_name(table_dtype(x.dtype())), ", got ", inv_freq.str());
  LT_CHECK(position_ids.dim() == 1 && position_ids.numel() == t &&
               (position_ids.dtype() == DType::kI32 || position_ids.dtype() == DType::kI64),
           "rope: position_ids ", position_ids.str(), " for x ", x.str());
  LT_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype() && y.is_contiguous(), "rope: y ",
           y.str(), " for x ", x.str());
  if (x.device().is_cuda()) {
    rope_apply_cuda(x, position_ids, inv_freq, inverse, y);
    return;
  }
  const std::vector<int64_t> pos = position_ids.to_i64();
  const Tensor xc = ops::contiguous_workspace(x), ic = ops::contiguous_workspace(inv_freq);
  const int64_t per_token = t == 0 ? 0 : x.numel() / t;
  const int64_t heads = d == 0 ? 0 : per_token / d;
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(xc.data_ptr());
    const A* pf = static_cast<const A*>(ic.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    const A sign = inverse ? A(-1) : A(1);
    parallel_for(t, cpu::grain_for(per_token), [&](int64_t tok) {
      std::vector<A> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
      const A p = static_cast<A>(pos[tok]);
      for (int64_t i = 0; i < half; ++i) {
        const A angle = p * pf[i];
        c[i] = std::cos(angle);
        s[i] = sign * std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = tok * per_token + h * d;
        for (int64_t i = 0; i < half; ++i) {
          // Both halves are read before either is written, so y may alias x.
          const A a = load(px, base + i), b = load(px, base + i + half);
          store(py, base + i, a * c[i] - b * s[i]);
          store(py, base + i + half, b * c[i] + a * s[i]);
        }
      }
    });
  });
}

Tensor rope(const Tensor& x, const Tensor& position_ids, const RopeConfig& cfg) {
  LT_CHECK(x.dim() >= 2 && x.size(-1) == cfg.head_dim, "rope: x ", x.str(), " for head_dim ",
           cfg.head_dim);
  const Tensor inv = inv_freq_tensor(cfg, x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  rope_apply(x.detach(), position_ids, inv, /*inverse=*/false, y);
  if (node_needed({x})) {
    auto node = std::make_shared<RopeBackward>();
    node->set_next_edges({x});
    node->position_ids = SavedTensor(position_ids);
    node->inv_freq = SavedTensor(inv);
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
