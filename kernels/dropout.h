// dropout: y = x * keep / (1 - p), elementwise, with the mask drawn from a Philox generator
//   x:[any shape] f32|bf16|f16|f64 -> y: same shape and dtype (contiguous).
// Mask: element i of x (in row-major order) uses the generator draw of numel(x) values at the
// generator's offset, keep[i] = philox_uniform(word i) < float(1 - p): exactly the tensor that
// bernoulli_(t, gen, 1 - p) fills from the same offset (engine/philox.h), on the host and on
// CUDA alike. The scaled product x * (1 / (1 - p)) is formed in f32 (f64 for f64) and rounded
// once; p = 1 gives zeros.
// Backward: dx = dy * keep / (1 - p), the mask regenerated from the saved Philox coordinates:
// nothing but those 24 bytes is saved.
// p = 0 returns x itself and draws nothing (as nn.Dropout(0) / PEFT's nn.Identity). Gradient
// checkpointing replays the same masks when the generator is registered with
// register_replayable_state (engine/rng.h GeneratorReplay), because each call takes its
// coordinates from the generator's offset.
#pragma once

#include "engine/philox.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace leantune::kernels {

// Differentiable; advances gen by ceil(numel/4) blocks when p > 0.
Tensor dropout(const Tensor& x, double p, Generator& gen);

// y = x * keep / (1 - p) for the draw `params` (Generator::take(numel)). x may be strided; y is
// contiguous with x's shape and dtype and may alias x.
void dropout_fwd(const Tensor& x, const Tensor& y, double p, const PhiloxParams& params);
// dx = dy * keep / (1 - p): the same mask applied to the gradient.
void dropout_bwd(const Tensor& dy, const Tensor& dx, double p, const PhiloxParams& params);

// The CUDA implementation of both (x, y contiguous on one device).
void dropout_apply_cuda(const Tensor& x, const Tensor& y, double p, const PhiloxParams& params);

}  // namespace leantune::kernels
