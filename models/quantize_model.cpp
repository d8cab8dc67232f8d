// quantize_model / load_quantized: module selection, the dense -> quantized swap, and a loader
// that quantizes weight by weight on the host. Contract in quantize_model.h.
#include "models/quantize_model.h"

#include <unordered_set>
#include <utility>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "loaders/model_config.h"
#include "loaders/safetensors.h"
#include "models/checkpoint_checks.h"
#include "models/quantized_linear.h"

namespace leantune {

namespace {

// True when `key` occurs in `name` as a run of whole dot-separated components.
bool matches_components(const std::string& name, const std::string& key) {
  if (key.empty()) return false;
  for (size_t pos = name.find(key); pos != std::string::npos; pos = name.find(key, pos + 1)) {
    const size_t end = pos + key.size();
    const bool starts = pos == 0 || name[pos - 1] == '.';
    const bool ends = end == name.size() || name[end] == '.';
    if (starts && ends) return true;
  }
  return false;
}

void check_model_dtype(const QuantConfig& cfg, DType model_dtype) {
  LT_CHECK_INPUT(cfg.compute_dtype == model_dtype,
                 "quantized layers compute in the model's dtype (", dtype_name(model_dtype),
                 "), but bnb_4bit_compute_dtype asks for ", dtype_name(cfg.compute_dtype));
}

// The head's product (DecoderModel::logits, the fused loss) reads the dense matrix.
void check_quantizable(const LinearModule& m) {
  LT_CHECK_INPUT(m.name != "lm_head",
                 "lm_head cannot be quantized (the head's product reads the dense matrix); keep "
                 "it in llm_int8_skip_modules");
}

// Swaps one module's dense weight for `base`.
void install(LinearModule& m, std::shared_ptr<LinearBase> base, DType dtype,
             QuantizeReport& report) {
  report.dense_bytes += m.out_features * m.in_features * static_cast<int64_t>(dtype_size(dtype));
  report.quantized_bytes += base->storage_bytes();
  ++report.quantized_modules;
  m.base = std::move(base);
  m.weight = Tensor();
}

}  // namespace

void check_quant_config(const QuantConfig& cfg) {
  LT_CHECK_INPUT(!(cfg.load_in_4bit && cfg.load_in_8bit),
                 "load_in_4bit and load_in_8bit are mutually exclusive: choose one");
}

bool quant_skips(const QuantConfig& cfg, const std::string& module_name) {
  for (const std::string& key : cfg.skip_modules)
    if (matches_components(module_name, key)) return true;
  return false;
}

std::shared_ptr<LinearBase> quantize_weight(const Tensor& w, Device device,
                                            const QuantConfig& cfg) {
  check_quant_config(cfg);
  LT_CHECK(cfg.enabled(), "quantize_weight: the config asks for no quantization");
  if (cfg.load_in_4bit) return Nf4Linear::quantize(w, device, cfg.double_quant);
  return Int8Linear::quantize(w, device);
}

QuantizeReport quantize_model(DecoderModel& model, const QuantConfig& cfg) {
  check_quant_config(cfg);
  QuantizeReport report;
  if (!cfg.enabled()) return report;
  check_model_dtype(cfg, model.dtype());
  // Every check before the first module changes, so that an error leaves the model as it was.
  std::vector<LinearModule*> todo;
  for (LinearModule* m : model.linear_modules()) {
    if (quant_skips(cfg, m->name)) {
      ++report.skipped_modules;
      continue;
    }
    check_quantizable(*m);
    LT_CHECK_INPUT(!m->base, "module ", m->name, " is already quantized (", m->base->kind(), ")");
    LT_CHECK(m->weight.defined(), "quantize_model: module ", m->name, " has no weight");
    todo.push_back(m);
  }
  NoGradGuard ng;
  for (LinearModule* m : todo)
    install(*m, quantize_weight(m->weight, model.device(), cfg), model.dtype(), report);
  return report;
}

std::shared_ptr<DecoderModel> load_quantized(const std::string& dir, Device device, DType dtype,
                                             const QuantConfig& cfg, QuantizeReport* report) {
  check_quant_config(cfg);
  if (!cfg.enabled()) {
    if (report) *report = QuantizeReport{};
    return DecoderModel::load(dir, device, dtype);
  }
  check_model_dtype(cfg, dtype);
  const ModelConfig mc = ModelConfig::load(dir);
  check_causal_lm(mc, dir);
  // Dense weights are allocated only for the modules that stay dense: the whole dense model
  // never sits on the device.
  auto model = std::make_shared<DecoderModel>(mc, device, dtype, /*allocate_linear_weights=*/false);
  std::vector<LinearModule*> to_quantize;
  QuantizeReport rep;
  for (LinearModule* m : model->linear_modules()) {
    if (quant_skips(cfg, m->name)) {
      ++rep.skipped_modules;
      if (!m->weight.defined()) {
        m->weight = Tensor::empty({m->out_features, m->in_features}, dtype, device, MemTag::kParam);
        m->weight.set_name(m->name + ".weight");
        m->weight.set_param(true);
      }
      continue;
    }
    check_quantizable(*m);
    to_quantize.push_back(m);
  }

  const TensorStore store = TensorStore::open(dir);
  NoGradGuard ng;
  std::vector<std::string> missing;
  for (auto& [name, t] : model->named_parameters()) {
    if (!t.defined()) continue;  // a weight that is quantized below
    if (!store.contains(name)) {
      missing.push_back(name);
      continue;
    }
    Tensor src = store.get(name);
    check_checkpoint_tensor(name, src, t.shape());
    t.copy_(src);
    src = Tensor();
    store.release(name);  // streaming: the file's pages go once the tensor is on the device
  }
  for (LinearModule* m : to_quantize) {
    const std::string name = m->name + ".weight";
    if (!store.contains(name)) {
      missing.push_back(name);
      continue;
    }
    {
      const Tensor src = store.get(name);
      check_checkpoint_tensor(name, src, {m->out_features, m->in_features});
      // In the compute dtype first (host), as transformers casts before bitsandbytes quantizes.
      const Tensor host = src.dtype() == dtype ? src : src.to(dtype);
      install(*m, quantize_weight(host, device, cfg), dtype, rep);
    }
    store.release(name);
  }
  check_no_missing_tensors(missing, "checkpoint " + dir);
  std::unordered_set<std::string> used;
  for (const auto& [name, t] : model->named_parameters()) used.insert(name);
  for (const LinearModule* m : to_quantize) used.insert(m->name + ".weight");
  check_unexpected_tensors(store, used, mc);
  if (report) *report = rep;
  return model;
}

}  // namespace leantune
