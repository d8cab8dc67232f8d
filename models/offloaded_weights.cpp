// OffloadedWeights and load_offloaded: a frozen model's decoder layers in pinned host memory,
// brought to the device one layer at a time with the next one prefetched (offloaded_weights.h).
#include "models/offloaded_weights.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/cuda_api.h"
#include "engine/mem_phase.h"
#include "loaders/model_config.h"
#include "loaders/safetensors.h"
#include "models/checkpoint_checks.h"

namespace leantune {

OffloadedWeights::OffloadedWeights(std::shared_ptr<DecoderModel> model, std::vector<Part> parts,
                                   bool prefetch)
    : model_(std::move(model)), prefetch_(prefetch) {
  for (Part& p : parts) {
    const Tensor& t = p.device;
    LT_CHECK(p.unit >= 0 && t.storage()->memory_released() && t.is_contiguous() &&
                 p.host.is_contiguous() && p.host.nbytes() == t.nbytes() &&
                 t.nbytes() == t.storage()->nbytes() && p.host.dtype() == t.dtype(),
             "OffloadedWeights: ", t.str(), " of layer ", p.unit,
             " must be a released, contiguous tensor of its own storage with a host copy of "
             "its bytes");
    Layer& l = layers_[p.unit];
    l.bytes += static_cast<int64_t>(t.nbytes());
    stats_.host_bytes += static_cast<int64_t>(p.host.nbytes());
    l.device.push_back(std::move(p.device));
    l.host.push_back(std::move(p.host));
  }
  for (const auto& [unit, l] : layers_)
    stats_.layer_bytes_max = std::max(stats_.layer_bytes_max, l.bytes);
  model_->set_param_residency(this);
}

OffloadedWeights::~OffloadedWeights() {
  for (auto& [unit, l] : layers_)
    if (l.in_flight) l.in_flight->synchronize();
  model_->set_param_residency(nullptr);
}

// Device storages back (on the compute stream, where their previous user may still be queued).
void OffloadedWeights::restore(Layer& l) {
  MemTagGuard tag(MemTag::kParam);
  for (const Tensor& t : l.device) t.storage()->restore_memory();
  l.resident = true;
  resident_bytes_ += l.bytes;
  stats_.resident_peak = std::max(stats_.resident_peak, resident_bytes_);
}

void OffloadedWeights::prefetch(int64_t unit) {
  auto it = layers_.find(unit);
  if (it == layers_.end()) return;
  Layer& l = it->second;
  if (l.resident) return;  // in use, or prefetched already
  const Device dev = model_->device();
  const Stream compute = current_stream(dev), copy = copy_stream(dev);
  restore(l);
  if (copy != compute) copy.wait_stream(compute);
  for (size_t i = 0; i < l.device.size(); ++i) {
    copy_bytes_async(l.device[i].data_ptr(), l.host[i].data_ptr(),
                     static_cast<int64_t>(l.host[i].nbytes()), dev, CopyKind::kHostToDevice, copy);
    l.device[i].storage()->record_stream(copy);
    l.host[i].storage()->record_stream(copy);
  }
  l.in_flight = std::make_unique<Event>(dev);
  l.in_flight->record(copy);
  stats_.bytes_copied += l.bytes;
}

void OffloadedWeights::acquire(int64_t unit) {
  auto it = layers_.find(unit);
  if (it == layers_.end()) return;  // the outer unit stays on the device
  Layer& l = it->second;
  if (l.uses++ > 0) return;
  MemPhaseGuard phase(MemPhaseKind::kOffload);
  const Device dev = model_->device();
  if (l.in_flight) {
    l.in_flight->wait(current_stream(dev));
    l.in_flight.reset();
    ++stats_.layers_prefetched;
  } else {
    restore(l);
    const Stream compute = current_stream(dev);
    for (size_t i = 0; i < l.device.size(); ++i)
      copy_bytes_async(l.device[i].data_ptr(), l.host[i].data_ptr(),
                       static_cast<int64_t>(l.host[i].nbytes()), dev, CopyKind::kHostToDevice,
                       compute);
    stats_.bytes_copied += l.bytes;
    ++stats_.layers_copied_now;
  }
  if (!prefetch_ || layers_.size() < 2) return;
  auto next = std::next(it);
  prefetch(next == layers_.end() ? layers_.begin()->first : next->first);
}

void OffloadedWeights::release(int64_t unit) {
  auto it = layers_.find(unit);
  if (it == layers_.end()) return;
  Layer& l = it->second;
  LT_CHECK(l.uses > 0, "OffloadedWeights: layer ", unit, " released more often than acquired");
  if (--l.uses > 0) return;
  for (const Tensor& t : l.device) t.storage()->release_memory();
  l.resident = false;
  resident_bytes_ -= l.bytes;
}

OffloadedModel load_offloaded(const std::string& dir, Device device, DType dtype, bool prefetch,
                              const QuantConfig& quant) {
  const ModelConfig mc = ModelConfig::load(dir);
  check_causal_lm(mc, dir);
  const bool quantize = quant.enabled();
  if (quantize) check_quant_config(quant);
  auto in_layer = [](const std::string& name) {
    return ParamResidency::unit_of(name) != ParamResidency::kOuterUnit;
  };
  // The layers' projections get their weights below, one tensor at a time (quantized ones none:
  // their stored form is made from the checkpoint); the outer unit's head as usual.
  auto model = std::make_shared<DecoderModel>(mc, device, dtype, /*allocate_linear_weights=*/false);
  std::vector<LinearModule*> to_quantize;
  for (LinearModule* m : model->linear_modules()) {
    if (m->weight.defined()) continue;
    const std::string name = m->name + ".weight";
    if (quantize && in_layer(name) && !quant_skips(quant, m->name)) {
      to_quantize.push_back(m);
      continue;
    }
    m->weight = Tensor::empty({m->out_features, m->in_features}, dtype, device, MemTag::kParam);
    m->weight.set_name(name);
    m->weight.set_param(true);
    if (in_layer(name)) m->weight.storage()->release_memory();
  }
  const TensorStore store = TensorStore::open(dir);
  NoGradGuard ng;
  std::vector<std::string> missing;
  std::vector<OffloadedWeights::Part> parts;
  // A layer tensor on the device -> a pinned copy, and its device memory released.
  auto offload = [&](const std::string& name, const Tensor& t, const Tensor& src) {
    Tensor h = Tensor::empty_pinned(t.shape(), t.dtype(), MemTag::kParam);
    h.copy_(src);
    if (!t.storage()->memory_released()) t.storage()->release_memory();
    parts.push_back({ParamResidency::unit_of(name), t, std::move(h)});
  };
  for (auto& [name, t] : model->named_parameters()) {
    if (!t.defined()) continue;  // quantized below
    if (!store.contains(name)) {
      missing.push_back(name);
      continue;
    }
    Tensor src = store.get(name);
    check_checkpoint_tensor(name, src, t.shape());
    if (in_layer(name))
      offload(name, t, src);
    else
      t.copy_(src);
    src = Tensor();
    store.release(name);
  }
  std::unordered_set<std::string> used;
  for (LinearModule* m : to_quantize) {
    const std::string name = m->name + ".weight";
    used.insert(name);
    if (!store.contains(name)) {
      missing.push_back(name);
      continue;
    }
    {
      const Tensor src = store.get(name);
      check_checkpoint_tensor(name, src, {m->out_features, m->in_features});
      // In the compute dtype first (host), as load_quantized does.
      m->base = quantize_weight(src.dtype() == dtype ? src : src.to(dtype), device, quant);
    }
    store.release(name);
    for (const auto& [part, t] : m->base->stored_tensors())
      if (t.defined()) offload(name, t, t);
  }
  check_no_missing_tensors(missing, "checkpoint " + dir);
  for (const auto& [name, t] : model->named_parameters()) used.insert(name);
  check_unexpected_tensors(store, used, mc);
  OffloadedModel out;
  out.weights = std::make_shared<OffloadedWeights>(model, std::move(parts), prefetch);
  out.model = std::move(model);
  return out;
}

}  // namespace leantune
