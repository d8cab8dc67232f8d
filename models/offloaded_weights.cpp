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

OffloadedWeights::OffloadedWeights(std::shared_ptr<DecoderModel> model,
                                   std::vector<std::pair<std::string, Tensor>> host, bool prefetch)
    : model_(std::move(model)), prefetch_(prefetch) {
  size_t k = 0;
  for (const auto& [name, t] : model_->named_parameters()) {
    const int64_t unit = unit_of(name);
    if (unit == kOuterUnit) continue;
    LT_CHECK(k < host.size() && host[k].first == name, "OffloadedWeights: no host copy of ", name);
    const Tensor& h = host[k++].second;
    LT_CHECK(t.storage()->memory_released() && t.is_contiguous() && h.is_contiguous() &&
                 h.nbytes() == t.nbytes() && t.nbytes() == t.storage()->nbytes() &&
                 h.dtype() == t.dtype(),
             "OffloadedWeights: ", name,
             " must be a released, contiguous tensor of its own "
             "storage with a host copy of its bytes");
    Layer& l = layers_[unit];
    l.device.push_back(t);
    l.host.push_back(h);
    l.bytes += static_cast<int64_t>(t.nbytes());
    stats_.host_bytes += static_cast<int64_t>(h.nbytes());
  }
  LT_CHECK(k == host.size(), "OffloadedWeights: ", host.size() - k, " host copies left over");
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

OffloadedModel load_offloaded(const std::string& dir, Device device, DType dtype, bool prefetch) {
  const ModelConfig mc = ModelConfig::load(dir);
  check_causal_lm(mc, dir);
  // The layers' projections get their weights below, one tensor at a time; the outer unit's
  // head is allocated as usual.
  auto model = std::make_shared<DecoderModel>(mc, device, dtype, /*allocate_linear_weights=*/false);
  for (LinearModule* m : model->linear_modules()) {
    if (m->weight.defined()) continue;
    m->weight = Tensor::empty({m->out_features, m->in_features}, dtype, device, MemTag::kParam);
    m->weight.set_name(m->name + ".weight");
    m->weight.set_param(true);
    if (ParamResidency::unit_of(m->name + ".weight") != ParamResidency::kOuterUnit)
      m->weight.storage()->release_memory();
  }
  const TensorStore store = TensorStore::open(dir);
  NoGradGuard ng;
  std::vector<std::string> missing;
  std::vector<std::pair<std::string, Tensor>> host;
  for (auto& [name, t] : model->named_parameters()) {
    if (!store.contains(name)) {
      missing.push_back(name);
      continue;
    }
    Tensor src = store.get(name);
    check_checkpoint_tensor(name, src, t.shape());
    if (ParamResidency::unit_of(name) == ParamResidency::kOuterUnit) {
      t.copy_(src);
    } else {
      Tensor h = Tensor::empty_pinned(t.shape(), dtype, MemTag::kParam);
      h.copy_(src);
      if (!t.storage()->memory_released()) t.storage()->release_memory();
      host.emplace_back(name, std::move(h));
    }
    src = Tensor();
    store.release(name);
  }
  check_no_missing_tensors(missing, "checkpoint " + dir);
  std::unordered_set<std::string> used;
  for (const auto& [name, t] : model->named_parameters()) used.insert(name);
  check_unexpected_tensors(store, used, mc);
  OffloadedModel out;
  out.weights = std::make_shared<OffloadedWeights>(model, std::move(host), prefetch);
  out.model = std::move(model);
  return out;
}

}  // namespace leantune
