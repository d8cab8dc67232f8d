// rope: rotary position embedding, Hugging Face's rotate_half convention.
//   x:[T,N,D] (N heads; any shape [T, ..., D]), position_ids:[T] i32|i64 (host for the CPU
//   path), inv_freq:[R/2] f32 (f64 for f64 x), R = 2 numel(inv_freq) <= D even -> y like x
//   (contiguous; y may alias x).
//   angle = pos * inv_freq[i] formed in f32 like transformers' f32 matmul (f64 for f64 x);
//   c = cos(angle) * scale, s = sin(angle) * scale (s negated when inverse), each rounded once;
//   y[i] = x[i] c - x[i+R/2] s,  y[i+R/2] = x[i+R/2] c + x[i] s  for i < R/2; y[j] = x[j], j >= R.
// The CPU path computes cos/sin once per token (D/2 values) and reuses them for all heads.
// Backward is the inverse rotation of dy with the same scale; saved: position_ids and the
// [R/2] inv_freq table.
// rope_inv_freq reproduces transformers' rope init functions in float32 arithmetic:
//   default: inv = 1 / theta^(f32(2i) / D) (a float32 power of a float32 base);
//   linear:  inv / factor;
//   llama3:  wavelen = 2pi/inv; wavelen > orig/low -> inv/factor; wavelen < orig/high -> inv;
//            otherwise (1-s) * inv/factor + s * inv with s = (orig/wavelen - low)/(high - low);
//   longrope: inv = 1 / (ext[i] * theta^(f32(2i) / R)), ext = short_factor or long_factor.
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/cpu_common.h"

namespace leantune::kernels {

namespace {

DType table_dtype(DType x) { return x == DType::kF64 ? DType::kF64 : DType::kF32; }

// The [R/2] table for x's dtype and device.
Tensor inv_freq_tensor(const RopeConfig& cfg, const Tensor& x) {
  return Tensor::from_doubles(rope_inv_freq(cfg), {cfg.rotary() / 2}, table_dtype(x.dtype()),
                              x.device(), MemTag::kWorkspace);
}

class RopeBackward final : public Node {
 public:
  SavedTensor position_ids, inv_freq;
  double scale = 1.0;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined() || !needs_input_grad(0)) return {Tensor()};
    Tensor dy = grads[0];
    const Tensor inv = inv_freq.unpack();
    const DType want = inv.dtype() == DType::kF64 ? DType::kF64 : dy.dtype();
    if (dy.dtype() != want) dy = dy.to(want);
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    rope_apply(dy, position_ids.unpack(), inv, /*inverse=*/true, dx, scale);
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
  const int64_t rot = cfg.rotary();
  LT_CHECK(cfg.head_dim > 0 && rot > 0 && rot % 2 == 0 && rot <= cfg.head_dim, "rope: head_dim ",
           cfg.head_dim, ", rotary_dim ", cfg.rotary_dim, " must be positive, even and nested");
  const std::string& type = cfg.scaling_type;
  LT_CHECK_INPUT(type.empty() || type == "default" || type == "linear" || type == "llama3" ||
                     type == "longrope",
                 "rope_scaling type \"", type,
                 "\" is not supported (supported: default, linear, llama3, longrope)");
  const int64_t half = rot / 2;
  const float base = static_cast<float>(cfg.theta);
  const float dim = static_cast<float>(rot);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / dim;
    // torch's pow of two float32 operands; double pow rounded once is the correctly rounded
    // float32 result, which is what a <1 ulp float32 pow returns for these arguments.
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv[i] = 1.0f / p;
  }
  if (type == "longrope") {
    const std::vector<double>& ext = cfg.use_long ? cfg.long_factor : cfg.short_factor;
    LT_CHECK_INPUT(static_cast<int64_t>(ext.size()) == half,
                   "rope_scaling longrope: ", cfg.use_long ? "long_factor" : "short_factor",
                   " has ", ext.size(), " values, the rotary dimension needs ", half);
    // transformers: 1.0 / (ext_factors * base**inv_freq_shape), all float32.
    for (int64_t i = 0; i < half; ++i) {
      const float e = static_cast<float>(2 * i) / dim;
      const float p =
          static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
      inv[i] = 1.0f / (static_cast<float>(ext[i]) * p);
    }
  } else if (type == "linear") {
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
                const Tensor& y, double scale) {
  ProfileScope prof(OpKind::kRope, x.device());
  LT_CHECK(x.dim() >= 2 && dtype_is_floating(x.dtype()), "rope: x ", x.str(),
           " must be [T, ..., D] float");
  const int64_t t = x.size(0), d = x.size(-1), half = inv_freq.numel();
  LT_CHECK(half > 0 && 2 * half <= d && inv_freq.dtype() == table_dtype(x.dtype()), "rope: x ",
           x.str(), " needs inv_freq [R/2] with R <= head_dim, ",
           dtype_name(table_dtype(x.dtype())), ", got ", inv_freq.str());
  LT_CHECK(position_ids.dim() == 1 && position_ids.numel() == t &&
               (position_ids.dtype() == DType::kI32 || position_ids.dtype() == DType::kI64),
           "rope: position_ids ", position_ids.str(), " for x ", x.str());
  LT_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype() && y.is_contiguous(), "rope: y ",
           y.str(), " for x ", x.str());
  if (x.device().is_cuda()) {
    rope_apply_cuda(x, position_ids, inv_freq, inverse, scale, y);
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
    const A sc = static_cast<A>(scale);
    parallel_for(t, cpu::grain_for(per_token), [&](int64_t tok) {
      std::vector<A> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
      const A p = static_cast<A>(pos[tok]);
      for (int64_t i = 0; i < half; ++i) {
        const A angle = p * pf[i];
        c[i] = std::cos(angle);
        s[i] = sign * std::sin(angle);
        if (scale != 1.0) {  // transformers' cos * attention_scaling, rounded once
          c[i] *= sc;
          s[i] *= sc;
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = tok * per_token + h * d;
        for (int64_t i = 0; i < half; ++i) {
          // Both halves are read before either is written, so y may alias x.
          const A a = load(px, base + i), b = load(px, base + i + half);
          store(py, base + i, a * c[i] - b * s[i]);
          store(py, base + i + half, b * c[i] + a * s[i]);
        }
        if (py != px)
          for (int64_t j = 2 * half; j < d; ++j) py[base + j] = px[base + j];
      }
    });
  });
}

Tensor rope(const Tensor& x, const Tensor& position_ids, const RopeConfig& cfg) {
  LT_CHECK(x.dim() >= 2 && x.size(-1) == cfg.head_dim, "rope: x ", x.str(), " for head_dim ",
           cfg.head_dim);
  const Tensor inv = inv_freq_tensor(cfg, x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  rope_apply(x.detach(), position_ids, inv, /*inverse=*/false, y, cfg.attention_factor);
  if (node_needed({x})) {
    auto node = std::make_shared<RopeBackward>();
    node->scale = cfg.attention_factor;
    node->set_next_edges({x});
    node->position_ids = SavedTensor(position_ids);
    node->inv_freq = SavedTensor(inv);
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
