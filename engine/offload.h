// Activation offloading: saved-tensor hooks that move what backward needs to pinned host memory
// during forward and bring it back during backward (TRL's OffloadActivations, done natively).
//
// Contract
// - Scope: an ActivationOffloader lives around the forward AND the backward of one micro-batch.
//   While it lives, every SavedTensor created on this thread passes through its pack/unpack.
// - What moves: a saved tensor is copied to the host unless one of these holds (each counted
//   in OffloadStats):
//     * it was saved inside a NoOffloadScope (the model enters one around the final norm, the
//       LM head and the loss: too much memory traffic for too little compute);
//     * it is a parameter or lives in a parameter's storage (Tensor::is_param(), storage tagged
//       MemTag::kParam, or external storage such as an mmapped checkpoint);
//     * its storage is tagged MemTag::kGrad (gradients computed in forward, e.g. the dweight of
//       linear_cross_entropy);
//     * it is not device memory of options.device (a host tensor of a CUDA run, pinned memory,
//       another device), i.e. it is already where offloading would put it, or elsewhere;
//     * it covers fewer than min_offload_size bytes;
//   Nothing recomputed by checkpoint() passes here: the recompute pushes its own keep-in-place
//   hooks, so with gradient checkpointing only the layer inputs (what checkpoint() saves) move.
// - What a copy holds: the byte span of the storage that the saved view covers (start rounded
//   down to 256 bytes, so every restored view keeps the address alignment it had). Views are
//   rebuilt exactly (shape, strides, offset, dtype): unpack returns bit-identical data. A later
//   saved view whose span lies inside an existing copy of the same live storage reuses it: a
//   storage shared by several saved tensors moves once and comes back once.
// - Where memory lives: host copies in pinned_allocator() (MemTag::kActivation); restored
//   buffers in allocator(options.device) with the original storage's tag.
// - Forward (device -> host), per offloaded tensor: the copy stream waits for the compute stream
//   (the producer kernel), the copy is queued on the copy stream, both storages are marked with
//   record_stream(copy stream) so that the caching allocator never hands their blocks out again
//   before the copy has finished, an event is recorded, and the device tensor is kept in a stash
//   until that event completes (checked without blocking at every pack and backward node). When
//   more than max_fwd_stash_size copies are in flight the compute stream waits for the oldest
//   one (back-pressure, no host stall). Device memory thus returns to the allocator only after
//   its copy has finished.
// - Backward (host -> device): nodes created inside OffloadLayerScope(L) are recognised by
//   their sequence numbers; when backward reaches layer L, the copies of layers L and L-1 are
//   started on the copy stream (prefetch), so the next layer's reload overlaps this layer's
//   compute. Anything not yet restored is copied when unpacked (on demand). Before a restored
//   tensor is used, the compute stream waits for its copy event. A tensor still in the stash is
//   returned as is, without a round trip. The host copy is released as soon as its reload is
//   queued; the restored buffer is released when the last node that saved a view of it has run
//   (Node::release_saved), exactly as without offloading.
// - CPU: the same code runs with logical streams, events complete when recorded and copies are
//   memcpy into pinned_allocator() memory: the kActivation tag of allocator(Device::cpu())
//   falls while the pinned pool grows, so the logic and the accounting are tested everywhere.
// - End of scope: waits for the copy stream, drops the stash, removes the hooks and the
//   backward observer. Tensors still packed (a graph that was not run) stay restorable on
//   demand; their host copies live until that graph is dropped.
// - Threading: hooks and scopes are per thread; backward must run on the thread that ran
//   forward. Saved tensors must not be modified in place between forward and backward (as
//   without offloading: the engine keeps no version counters).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "engine/device.h"
#include "engine/scope_guard.h"

namespace leantune {

struct OffloadOptions {
  Device device = Device::cpu();    // the training device: its allocator's memory is offloaded
  int64_t min_offload_size = 1024;  // bytes; smaller tensors stay (TRL's default)
  bool use_streams = true;          // side copy stream + events; false: copies on the compute
                                    // stream, no prefetch (TRL's use_streams=False)
  int64_t max_fwd_stash_size = 5;   // device->host copies in flight before compute waits
  bool prefetch = true;             // reload layer L-1 while backward runs layer L (ours)
};

struct OffloadStats {
  int64_t tensors_packed = 0;      // every saved tensor seen
  int64_t tensors_offloaded = 0;   // host copies made
  int64_t bytes_offloaded = 0;     // bytes copied device -> host
  int64_t views_deduplicated = 0;  // saved tensors served by an existing host copy
  int64_t skipped_small = 0;       // under min_offload_size
  int64_t skipped_param = 0;       // parameters and their storage
  int64_t skipped_grad = 0;        // MemTag::kGrad storage
  int64_t skipped_no_offload = 0;  // saved inside a NoOffloadScope
  int64_t skipped_host = 0;        // not device memory of options.device
  int64_t host_bytes_current = 0;  // bytes of live host copies
  int64_t host_bytes_peak = 0;
  int64_t prefetches = 0;          // reloads started ahead of use
  int64_t restores_on_demand = 0;  // reloads started by unpack
  int64_t bytes_restored = 0;      // bytes copied host -> device
  int64_t stash_hits = 0;          // unpacks served by a device tensor still in the stash
  int64_t stash_waits = 0;         // times compute waited for the oldest in-flight copy
  int64_t skipped() const {
    return skipped_small + skipped_param + skipped_grad + skipped_no_offload + skipped_host;
  }
  // A run's totals over its micro-batches' offloaders: counts add, the host peak is the largest.
  void add_run_totals(const OffloadStats& s) {
    tensors_offloaded += s.tensors_offloaded;
    bytes_offloaded += s.bytes_offloaded;
    prefetches += s.prefetches;
    host_bytes_peak = std::max(host_bytes_peak, s.host_bytes_peak);
  }
};

class OffloadState;

// RAII: installs the hooks and the backward observer for one micro-batch (forward + backward).
// Scopes nest like SavedTensorHooksGuard (last in, first out).
class ActivationOffloader {
 public:
  explicit ActivationOffloader(const OffloadOptions& options = {});
  ~ActivationOffloader();
  ActivationOffloader(const ActivationOffloader&) = delete;
  ActivationOffloader& operator=(const ActivationOffloader&) = delete;

  OffloadStats stats() const;
  const OffloadOptions& options() const;

 private:
  std::shared_ptr<OffloadState> state_;
  OffloadState* prev_active_ = nullptr;
};

// Tags what is saved inside with decoder layer `layer` (for prefetch in backward). Costs a
// thread-local write when no offloader is active.
class OffloadLayerScope : ScopeGuard {
 public:
  explicit OffloadLayerScope(int64_t layer);
  ~OffloadLayerScope();

 private:
  int64_t prev_layer_;
  OffloadState* owner_;
  int64_t range_ = -1;
};

// Nothing saved inside is offloaded (the LM head and the loss). Nests.
class NoOffloadScope : ScopeGuard {
 public:
  NoOffloadScope();
  ~NoOffloadScope();
};

// The layer of the innermost OffloadLayerScope on this thread (-1 outside any).
int64_t current_offload_layer();
// True inside a NoOffloadScope on this thread.
bool in_no_offload_scope();
// True while an ActivationOffloader is alive on this thread.
bool activation_offloading_active();

}  // namespace leantune
