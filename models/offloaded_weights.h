// A frozen model whose decoder layers live in pinned host memory and come to the device one layer
// at a time: a distillation teacher (or any model run only forward, without gradients) larger
// than what the device can spare. The embedding, the final norm and the LM head (the outer unit)
// stay on the device.
// - Loading (load_offloaded): the model is built on the device without its layers' weights;
//   each layer tensor is read from the checkpoint straight into a pinned host copy (in the
//   model's dtype), and its device storage is allocated and released at once, so the device
//   never holds more than the outer unit and one tensor.
// - Use: the model brackets every use of layer i with acquire(i)/release(i) (ParamResidency).
//   acquire restores the layer's storages and copies them from the host (cudaMemcpyAsync from
//   pinned memory on the compute stream), unless they were prefetched; it then prefetches the
//   next layer (i + 1, the last layer prefetches layer 0 for the next forward) on the device's
//   copy stream, so that copy overlaps layer i's compute; the compute stream waits for a
//   prefetch's event before the layer is used. release gives the layer's device memory back.
//   At most two layers are on the device at once.
// - The host copies are tagged MemTag::kParam in pinned_allocator(); the restored device
//   storages keep their kParam tag in allocator(device). On the CPU the same code runs with
//   logical streams and memcpy: the logic and the accounting are tested everywhere.
// - Quantized layers (load_offloaded with a QuantConfig): each weight is quantized on the device
//   as load_quantized does, then its stored form (NF4 codes and quant state, int8 codes and
//   scales: LinearBase::stored_tensors) moves to the host like any other layer tensor.
// - Only forward without gradients: a layer's weights are not resident in backward (nothing
//   here holds them for a backward pass).
// - The OffloadedWeights must outlive every use of the model (it holds the model); destroying it
//   waits for the copy stream and detaches it, leaving the layers' storages released.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/stream.h"
#include "models/decoder.h"
#include "models/quantize_model.h"

namespace leantune {

struct OffloadedWeightsStats {
  int64_t host_bytes = 0;         // the layers' pinned host copies
  int64_t layer_bytes_max = 0;    // the largest layer's device bytes
  int64_t resident_peak = 0;      // most layer bytes on the device at once
  int64_t bytes_copied = 0;       // host -> device, in total
  int64_t layers_prefetched = 0;  // acquires served by a prefetch
  int64_t layers_copied_now = 0;  // acquires that copied on the compute stream
};

class OffloadedWeights final : public ParamResidency {
 public:
  // Takes over the layer tensors of `model` (units >= 0): `host` holds one pinned copy per
  // tensor, in the order of model.named_parameters(); their device storages must be released.
  struct Part {
    int64_t unit;   // >= 0: the decoder layer
    Tensor device;  // released, contiguous, the sole user of its storage
    Tensor host;    // its bytes, pinned
  };
  // Takes over the given layer tensors of `model`. Keeps the model alive: the residency detaches
  // from it on destruction.
  OffloadedWeights(std::shared_ptr<DecoderModel> model, std::vector<Part> parts,
                   bool prefetch = true);
  ~OffloadedWeights() override;
  OffloadedWeights(const OffloadedWeights&) = delete;
  OffloadedWeights& operator=(const OffloadedWeights&) = delete;

  void acquire(int64_t unit) override;
  void release(int64_t unit) override;
  const OffloadedWeightsStats& stats() const { return stats_; }

 private:
  struct Layer {
    std::vector<Tensor> device, host;
    int64_t bytes = 0;
    int uses = 0;
    bool resident = false;
    std::unique_ptr<Event> in_flight;  // a prefetch not yet waited for
  };
  void restore(Layer& l);
  void prefetch(int64_t unit);

  std::shared_ptr<DecoderModel> model_;
  bool prefetch_;
  std::map<int64_t, Layer> layers_;
  int64_t resident_bytes_ = 0;
  OffloadedWeightsStats stats_;
};

struct OffloadedModel {
  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<OffloadedWeights> weights;  // installed as the model's residency
};
// Loads an HF causal-LM folder as described above (the checks of DecoderModel::load: missing,
// misshapen and unexpected tensors are errors naming them); with `quant` enabled, the layers'
// projections are quantized first (NF4 or int8, quant_skips honoured).
OffloadedModel load_offloaded(const std::string& dir, Device device, DType dtype,
                              bool prefetch = true, const QuantConfig& quant = {});

}  // namespace leantune
