// Quantized base weights for a DecoderModel (QLoRA's load_in_4bit, and load_in_8bit), as
// transformers + bitsandbytes apply them: every linear module of the decoder gets a frozen
// quantized base (models/quantized_linear.h) and loses its dense weight, except the modules in
// skip_modules (llm_int8_skip_modules; by default lm_head stays in full precision). Embeddings,
// norms and biases stay dense in the model's dtype. Formats: kernels/quant.h.
//
// After quantization a LinearModule has `base` set and `weight` undefined; its dense storage is
// released (returned to the device's caching allocator) as soon as no other handle to the
// weight tensor exists, so quantize before anything (an optimizer, a parameter list) holds the
// weights. DecoderModel::named_parameters() still lists "<module>.weight" for such modules, as
// an undefined tensor.
//
// Weights are quantized on the host in the model's compute dtype (a weight stored in f32 on disk
// is rounded to bf16 first for a bf16 model, as transformers casts before bitsandbytes
// quantizes), so load_quantized() and load() + quantize_model() give identical bases.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "models/decoder.h"

namespace leantune {

struct QuantConfig {
  bool load_in_4bit = false;  // NF4, blocks of 64
  bool load_in_8bit = false;  // int8 per row
  bool double_quant = true;   // bnb_4bit_use_double_quant (NF4 only)
  // The dtype the quantized layers compute in (bnb_4bit_compute_dtype). leantune computes a
  // model in one dtype, so this must be the model's dtype.
  DType compute_dtype = DType::kBF16;
  // Modules kept dense. An entry matches a module whose name equals it or contains it as whole
  // dot-separated components ("lm_head", "mlp.down_proj", "layers.0").
  std::vector<std::string> skip_modules = {"lm_head"};

  bool enabled() const { return load_in_4bit || load_in_8bit; }
  std::string kind() const { return load_in_4bit ? "nf4" : load_in_8bit ? "int8" : "none"; }
};

// Error(kInput) when both load_in_4bit and load_in_8bit are set.
void check_quant_config(const QuantConfig& cfg);
// True when the module of this name stays dense under cfg.
bool quant_skips(const QuantConfig& cfg, const std::string& module_name);

struct QuantizeReport {
  int64_t quantized_modules = 0;
  int64_t skipped_modules = 0;
  int64_t dense_bytes = 0;      // the replaced weights, in the compute dtype
  int64_t quantized_bytes = 0;  // their quantized storage
};

// The quantized base for one dense [out, in] weight (any device; quantized on the host), placed
// on `device` (MemTag::kParam).
std::shared_ptr<LinearBase> quantize_weight(const Tensor& w, Device device, const QuantConfig& cfg);

// Replaces the dense weight of every linear module not skipped by a quantized base, one module
// at a time (a weight on a CUDA device is copied to the host, quantized and the result copied
// back). Error(kInput) when cfg is inconsistent, when cfg.compute_dtype differs from the model's
// dtype, when a module is already quantized, and when lm_head would be quantized (the head's
// product reads the dense matrix). A config with neither option set does nothing.
QuantizeReport quantize_model(DecoderModel& model, const QuantConfig& cfg);

// Builds the model from an HF folder with the quantized bases, reading each quantized weight
// from the checkpoint on the host and quantizing it there before its (quantized) form is copied
// to `device`: dense copies of those weights never reach the device. Everything else loads as
// DecoderModel::load does (Error(kInput) naming missing tensors or wrong shapes).
// Note: DecoderModel's constructor allocates every parameter, so the dense linear weights are
// allocated (uninitialised) and released again at the start: the device's reserved memory peaks
// at the dense model's size for that moment, until DecoderModel can be built without them.
std::shared_ptr<DecoderModel> load_quantized(const std::string& dir, Device device, DType dtype,
                                             const QuantConfig& cfg,
                                             QuantizeReport* report = nullptr);

}  // namespace leantune
