// LoRA (Hu et al., 2021) as PEFT's lora.Linear computes it, attached to a LinearModule as its
// LinearAdapter:
//   y = base(x) + scaling * B(A(dropout(x)))      A:[r, in], B:[out, r]
//   scaling = alpha / r, or alpha / sqrt(r) with rsLoRA (use_rslora).
// Initialisation (PEFT's default, init_lora_weights=True): A ~ kaiming_uniform(a=sqrt(5)) =
// U(-1/sqrt(in), 1/sqrt(in)) from the Philox stream (seed, RngPurpose::kLoraInit), B = 0, so the
// adapted model starts equal to the base. The base stays whatever it is (dense or quantized): the
// adapter only reads x and adds to base_out, and never asks for a base gradient.
//
// Dropout applies to the adapter's input only, while training, with one generator shared by all
// adapters of a model (Generator(seed, RngPurpose::kDropout)); every module draws its own mask in
// call order, as each of PEFT's nn.Dropout modules does. The generator is registered for replay
// under gradient checkpointing (register_dropout_generator), so recomputation redraws the same
// masks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/rng.h"
#include "engine/tensor.h"
#include "models/linear_module.h"

namespace leantune {

// alpha / r, or alpha / sqrt(r) when use_rslora.
double lora_scaling(double alpha, int64_t r, bool use_rslora);

// The fused, differentiable LoRA op:
//   y = base_out + scaling * (dropout(x) A^T) B^T
//   x:[..., in], base_out:[..., out] (same leading shape), A:[r, in], B:[out, r]; one float
//   dtype and one device. dropout_p > 0 needs `gen` (drawn once, numel(x) values).
// Forward forms u = dropout(x) A^T [T, r] in x's dtype and adds scaling * u B^T to base_out with
// f32 accumulation (f64 for f64), rounded once.
// Backward: d base_out = dy; dB = scaling dy^T u; du = scaling dy B; dA = du^T dropout(x);
// dx = dropout'(du A). Saved: x (the base projection saves the same tensor, so this costs no
// memory), u (small), A, B and the mask's Philox coordinates; the dropped input is regenerated,
// never stored. Gradients are computed only for inputs that need them.
// base_out by value: when the call holds the only reference to it and its storage (the caller
// moved it in: LinearModule::forward does) and it is contiguous, y is written into its storage,
// saving a [T, out] copy and allocation per adapted projection (its producer must not save it for
// backward; a linear saves x and W, not its output); otherwise y is a new tensor. The values are
// the same either way, bit for bit.
Tensor lora_linear(const Tensor& x, Tensor base_out, const Tensor& A, const Tensor& B,
                   double scaling, double dropout_p = 0.0, Generator* gen = nullptr);

// State shared by every adapter of one model.
struct LoraRuntime {
  bool training = true;  // dropout is active only while training
  bool enabled = true;   // false: forward returns the base output (a reference-model pass)
  std::shared_ptr<Generator> dropout_gen;
};

class LoraAdapter final : public LinearAdapter {
 public:
  // Allocates A [r, in] and B [out, r] (MemTag::kParam, requires_grad, named
  // "<module>.lora_A.weight" / "<module>.lora_B.weight"), both zero.
  LoraAdapter(std::string module_name, int64_t in_features, int64_t out_features, int64_t r,
              double alpha, bool use_rslora, double dropout, Device device, DType dtype,
              std::shared_ptr<LoraRuntime> runtime);

  Tensor forward(const Tensor& x, Tensor base_out) const override;

  // PEFT's default init: A ~ U(+-1/sqrt(in)) drawn from gen, B = 0.
  void reset_parameters(Generator& gen);
  // scaling * B A as a dense [out, in] tensor of `dtype`, formed in f32 (f64 for f64).
  Tensor delta_weight(DType dtype) const;

  const std::string& module_name() const { return module_name_; }
  const Tensor& lora_A() const { return a_; }
  const Tensor& lora_B() const { return b_; }
  int64_t r() const { return r_; }
  double alpha() const { return alpha_; }
  double scaling() const { return scaling_; }
  double dropout() const { return dropout_; }
  const std::shared_ptr<LoraRuntime>& runtime() const { return runtime_; }

 private:
  std::string module_name_;
  int64_t r_;
  double alpha_;
  double scaling_;
  double dropout_;
  Tensor a_, b_;
  std::shared_ptr<LoraRuntime> runtime_;
};

// Makes checkpoint() replay `gen`'s draws (engine/autograd.h). Holds a weak reference only: a
// generator that is destroyed simply drops out (the engine's GeneratorReplay keeps a raw
// pointer and the engine has no way to unregister one, so a per-model generator registered
// there directly would dangle once the model is gone).
void register_dropout_generator(const std::shared_ptr<Generator>& gen);

}  // namespace leantune
