// The gated MLP activations: y = act(gate) * up.
//   gate:[T,I], up:[T,I] (any equal shapes; strided inputs are copied) -> y:[T,I]; math in f32
//   (f64 for f64), one rounding per output element. Saves gate and up (not y).
// swiglu (Llama, Qwen, Mistral, Phi-3): act = silu, silu(g) = g * sigmoid(g).
//   Backward: dgate = dy * up * sig * (1 + g * (1 - sig)), dup = dy * silu(g).
// geglu (Gemma): act = gelu with the tanh approximation (torch's gelu(approximate="tanh"),
//   transformers' gelu_pytorch_tanh): gelu(g) = 0.5 g (1 + t), t = tanh(b (g + k g^3)),
//   b = sqrt(2/pi), k = 0.044715.
//   Backward: dgate = dy * up * (0.5 (1 + t) + 0.5 g (1 - t^2) b (1 + 3 k g^2)),
//   dup = dy * gelu(g).
#pragma once

#include "engine/tensor.h"

namespace leantune::kernels {

Tensor swiglu(const Tensor& gate, const Tensor& up);

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& y);
void swiglu_bwd(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                const Tensor& dup);

void swiglu_fwd_cuda(const Tensor& gate, const Tensor& up, const Tensor& y);
void swiglu_bwd_cuda(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup);

Tensor geglu(const Tensor& gate, const Tensor& up);

void geglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& y);
void geglu_bwd(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
               const Tensor& dup);

void geglu_fwd_cuda(const Tensor& gate, const Tensor& up, const Tensor& y);
void geglu_bwd_cuda(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                    const Tensor& dup);

}  // namespace leantune::kernels
