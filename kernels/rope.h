// rope: rotary position embedding, Hugging Face's rotate_half convention.
//   x:[T,N,D] (N heads, D = head_dim, even), position_ids:[T] i32|i64 -> y:[T,N,D]
//   angle[t,i] = pos[t] * inv_freq[i], i < D/2;  c = cos(angle), s = sin(angle)
//   y[..., i]       = x[..., i] * c - x[..., i + D/2] * s
//   y[..., i + D/2] = x[..., i + D/2] * c + x[..., i] * s
// Angles and cos/sin in f32 (f64 for f64 input), as transformers does for f32 models.
// Backward is the inverse rotation (angle -> -angle) of dy. No saved activations beyond the
// position ids.
// Partial rotary (rotary_dim < D, phi3's partial_rotary_factor): only the first rotary_dim
// values of each head rotate (pairs i, i + rotary_dim/2), the rest pass through unchanged.
// attention_factor (longrope) multiplies cos and sin, as transformers' attention_scaling does:
// y = factor * R x on the rotated part.
// inv_freq follows transformers' rope_init_fn: default 1/theta^(2i/R) (R = rotary_dim), "llama3"
// scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) with its
// smooth interpolation band; "linear" divides by factor; "longrope" divides by short_factor[i], or
// by long_factor[i] when `use_long` (the caller's choice: transformers uses the long factors for a
// forward whose largest position + 1 exceeds original_max_position_embeddings).
#pragma once

#include <string>
#include <vector>

#include "engine/tensor.h"

namespace leantune::kernels {

struct RopeConfig {
  int64_t head_dim = 64;
  double theta = 10000.0;
  std::string scaling_type;  // "" / "default", "llama3", "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  int64_t rotary_dim = 0;  // 0 = head_dim
  double attention_factor = 1.0;
  std::vector<double> short_factor, long_factor;  // longrope
  bool use_long = false;                          // longrope: this call uses long_factor

  int64_t rotary() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  // Longrope: whether a forward whose largest position is max_position uses the long factors.
  bool long_for(int64_t max_position) const {
    return scaling_type == "longrope" && max_position + 1 > original_max_position_embeddings;
  }
};

// [rotary/2] inverse frequencies, computed in f32 as transformers does (as doubles of those
// values).
std::vector<double> rope_inv_freq(const RopeConfig& cfg);

Tensor rope(const Tensor& x, const Tensor& position_ids, const RopeConfig& cfg);

// inv_freq:[R/2] f32 (f64 for f64 x) on x's device, R <= D the rotated part of each head.
// inverse = true rotates by -angle. cos and sin are multiplied by `scale` (attention_factor).
void rope_apply(const Tensor& x, const Tensor& position_ids, const Tensor& inv_freq, bool inverse,
                const Tensor& y, double scale = 1.0);
void rope_apply_cuda(const Tensor& x, const Tensor& position_ids, const Tensor& inv_freq,
                     bool inverse, double scale, const Tensor& y);

}  // namespace leantune::kernels
