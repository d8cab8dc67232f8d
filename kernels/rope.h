// rope: rotary position embedding, Hugging Face's rotate_half convention.
//   x:[T,N,D] (N heads, D = head_dim, even), position_ids:[T] i32|i64 -> y:[T,N,D]
//   angle[t,i] = pos[t] * inv_freq[i], i < D/2;  c = cos(angle), s = sin(angle)
//   y[..., i]       = x[..., i] * c - x[..., i + D/2] * s
//   y[..., i + D/2] = x[..., i + D/2] * c + x[..., i] * s
// Angles and cos/sin in f32 (f64 for f64 input), as transformers does for f32 models.
// Backward is the inverse rotation (angle -> -angle) of dy. No saved activations beyond the
// position ids.
// inv_freq follows transformers' rope_init_fn: default 1/theta^(2i/D), and "llama3" scaling
// (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) with its smooth
// interpolation band; "linear" divides by factor.
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
};

// [D/2] inverse frequencies, computed in f32 as transformers does (as doubles of those values).
std::vector<double> rope_inv_freq(const RopeConfig& cfg);

Tensor rope(const Tensor& x, const Tensor& position_ids, const RopeConfig& cfg);

// inv_freq:[D/2] f32 (f64 for f64 x) on x's device. inverse = true rotates by -angle.
void rope_apply(const Tensor& x, const Tensor& position_ids, const Tensor& inv_freq, bool inverse,
                const Tensor& y);
void rope_apply_cuda(const Tensor& x, const Tensor& position_ids, const Tensor& inv_freq,
                     bool inverse, const Tensor& y);

}  // namespace leantune::kernels
