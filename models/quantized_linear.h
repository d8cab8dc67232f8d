// Frozen quantized bases for LinearModule (models/linear_module.h): Nf4Linear (load_in_4bit,
// QLoRA) and Int8Linear (load_in_8bit). Formats and rounding: kernels/quant.h.
//
// forward(x, bias): y = x W^T + bias with W the dequantized weight, in x's dtype. x is [..., in]
// (any leading dimensions), bias [out] in x's dtype or undefined; y is [..., out].
// Autograd: differentiable with respect to x (dx = dy W) and the bias when it requires grad
// (db = column sums of dy); the weight never gets a gradient. The backward node keeps only the
// quantized weight (shared with the module, no copy), x's shape and dtype: no activation is
// saved, and W is dequantized again in backward (into the reused per-device scratch), so no
// dequantized weight lives between forward and backward.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "kernels/quant.h"
#include "models/linear_module.h"

namespace leantune {

// What both formats share: the quantized weight (W) and its storage.
template <typename Weight>
class QuantizedLinear : public LinearBase {
 public:
  const Weight& weight() const { return w_; }
  int64_t storage_bytes() const override { return w_.storage_bytes(); }

 protected:
  explicit QuantizedLinear(Weight w) : w_(std::move(w)) {}

 private:
  Weight w_;
};

class Nf4Linear final : public QuantizedLinear<kernels::Nf4Weight> {
 public:
  // w.shape must be [out, in].
  explicit Nf4Linear(kernels::Nf4Weight w);
  // Quantizes a dense [out, in] weight (any float dtype, any device; on the host) and places
  // the quantized form on `device` (MemTag::kParam).
  static std::shared_ptr<Nf4Linear> quantize(const Tensor& w, Device device, bool double_quant);

  Tensor forward(const Tensor& x, const Tensor& bias) const override;
  Tensor dequantize(DType dtype) const override;
  std::string kind() const override { return "nf4"; }
  // packed as "weight"; absmax, or when nested qabsmax as "weight.absmax" and absmax2 as
  // "weight.nested_absmax" (the offset is a host scalar, kept on every rank).
  std::vector<std::pair<std::string, Tensor>> stored_tensors() const override;

  int64_t out_features() const { return weight().shape[0]; }
  int64_t in_features() const { return weight().shape[1]; }
};

class Int8Linear final : public QuantizedLinear<kernels::Int8Weight> {
 public:
  explicit Int8Linear(kernels::Int8Weight w);
  static std::shared_ptr<Int8Linear> quantize(const Tensor& w, Device device);

  Tensor forward(const Tensor& x, const Tensor& bias) const override;
  Tensor dequantize(DType dtype) const override;
  std::string kind() const override { return "int8"; }
  // q as "weight", absmax as "SCB".
  std::vector<std::pair<std::string, Tensor>> stored_tensors() const override;

  int64_t out_features() const { return weight().rows(); }
  int64_t in_features() const { return weight().cols(); }
};

}  // namespace leantune
