// Activation offloading (see engine/offload.h for the contract).
//
// Objects and who owns what:
//   OffloadState  the hooks + backward observer; owned by the ActivationOffloader and by every
//                 SavedTensor packed through it (so a graph may outlive the scope).
//   Packed        what pack() returns: the tensor itself when it stays, else a HostCopy and the
//                 view's metadata. Owned by the SavedTensor.
//   HostCopy      one offloaded byte span of one device storage: the pinned host buffer, the
//                 source while its copy is in flight (stash), and the restored device buffer.
//                 Owned by the Packed views that refer to it; the state only keeps weak
//                 references (dedup by storage, prefetch by layer, the stash), so a restored
//                 buffer is freed when the last node that saved it releases its saved tensors.
#include "engine/offload.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/check.h"
#include "engine/cuda_api.h"
#include "engine/mem_phase.h"
#include "engine/profile.h"
#include "engine/stream.h"
#include "engine/tensor.h"

namespace leantune {

namespace {

thread_local int64_t t_layer = -1;
thread_local int t_no_offload_depth = 0;
thread_local OffloadState* t_active = nullptr;

// Copies start at a multiple of this many bytes of their storage, so that a restored view has
// the same address alignment modulo 256 as the original (kernels choose vector widths by
// address).
constexpr int64_t kSpanAlign = 256;

// Node sequence numbers come from one engine-wide counter; a throwaway node reads it. Nodes
// created between two readings were created between those two moments.
class SequenceProbe final : public Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&&) override { return {}; }
  std::string name() const override { return "SequenceProbe"; }
};
uint64_t next_sequence_nr() { return SequenceProbe().sequence_nr(); }

Tensor view_over(std::shared_ptr<Storage> storage, const Shape& shape, const Shape& strides,
                 int64_t offset, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

// The bytes [lo, hi) of its storage that a non-empty view touches.
std::pair<int64_t, int64_t> byte_span(const Tensor& t) {
  int64_t lo = t.offset(), hi = t.offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t extent = (t.shape()[d] - 1) * t.strides()[d];
    if (extent < 0)
      lo += extent;
    else
      hi += extent;
  }
  const auto es = static_cast<int64_t>(t.element_size());
  return {lo * es, (hi + 1) * es};
}

struct HostCopy;

struct Packed {
  Tensor kept;                     // the tensor itself when it stays
  std::shared_ptr<HostCopy> copy;  // else its host copy and the view over it
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // elements, in the source storage
  DType dtype = DType::kF32;
};

}  // namespace

class OffloadState final : public SavedTensorHooks,
                           public BackwardObserver,
                           public std::enable_shared_from_this<OffloadState> {
 public:
  explicit OffloadState(const OffloadOptions& opt);

  std::shared_ptr<void> pack(const Tensor& t) override;
  Tensor unpack(const std::shared_ptr<void>& packed) override;
  void before_node(Node& node) override;

  int64_t begin_layer(int64_t layer);
  void end_layer(int64_t range);
  // Waits for the copy stream and drops every reference the state holds (end of the scope).
  void close();
  void host_released(int64_t bytes) { stats_.host_bytes_current -= bytes; }

  const OffloadOptions& options() const { return opt_; }
  const OffloadStats& stats() const { return stats_; }

 private:
  struct StashEntry {
    std::weak_ptr<HostCopy> copy;
    std::shared_ptr<Event> done;  // the device -> host copy has finished
  };
  struct Range {  // nodes created while OffloadLayerScope(layer) was open
    uint64_t begin;
    uint64_t end;
    int64_t layer;
  };

  Stream copy_stream() const { return opt_.use_streams ? side_ : current_stream(opt_.device); }
  std::shared_ptr<void> keep(const Tensor& t, int64_t* counter);
  std::shared_ptr<HostCopy> offload(const Tensor& t, int64_t lo, int64_t hi, int64_t layer);
  void restore(HostCopy& c);
  void prefetch_layer(int64_t layer);
  void retire_stash();
  void release_stash_front();

  OffloadOptions opt_;
  OffloadStats stats_;
  Stream side_;
  bool closed_ = false;
  std::deque<StashEntry> stash_;
  std::unordered_map<const Storage*, std::vector<std::weak_ptr<HostCopy>>> by_storage_;
  std::unordered_map<int64_t, std::vector<std::weak_ptr<HostCopy>>> by_layer_;
  std::vector<Range> ranges_;  // in order of begin
  // Read when backward reaches its first node after a forward: nodes with a larger sequence
  // number were created during backward (the recompute of checkpoint()), not by the layers.
  uint64_t horizon_ = 0;
  bool backward_started_ = false;
};

namespace {

struct HostCopy {
  explicit HostCopy(std::shared_ptr<OffloadState> o) : owner(std::move(o)) {}
  ~HostCopy() { drop_host(); }
  HostCopy(const HostCopy&) = delete;
  HostCopy& operator=(const HostCopy&) = delete;

  // The allocator keeps the block until the copies recorded on it are done (record_stream).
  void drop_host() {
    if (!host) return;
    owner->host_released(nbytes);
    host.reset();
  }

  std::shared_ptr<OffloadState> owner;
  Device device;
  MemTag tag = MemTag::kActivation;
  int64_t begin = 0;  // byte offset of the span in the source storage
  int64_t nbytes = 0;
  int64_t layer = -1;
  std::weak_ptr<Storage> source;
  std::shared_ptr<Storage> host;      // pinned copy, until the reload is queued
  std::shared_ptr<Storage> stashed;   // the source, while the stash holds it
  std::shared_ptr<Storage> restored;  // device buffer with the span, once reloaded
  std::shared_ptr<Event> written;     // the host copy is complete
  std::unique_ptr<Event> ready;       // the reload has finished
};

}  // namespace

OffloadState::OffloadState(const OffloadOptions& opt) : opt_(opt) {
  LT_CHECK(opt.min_offload_size >= 0, "activation offloading: min_offload_size ",
           opt.min_offload_size, " must be >= 0");
  LT_CHECK(opt.max_fwd_stash_size >= 0, "activation offloading: max_fwd_stash_size ",
           opt.max_fwd_stash_size, " must be >= 0");
  LT_CHECK_INPUT(opt.device.is_cpu() || opt.device.index < cuda_device_count(),
                 "activation offloading on ", opt.device.str(), ", which this process cannot use");
  if (opt_.use_streams) side_ = leantune::copy_stream(opt_.device);
}

std::shared_ptr<void> OffloadState::keep(const Tensor& t, int64_t* counter) {
  if (counter) ++*counter;
  auto p = std::make_shared<Packed>();
  p->kept = t;
  return p;
}

std::shared_ptr<void> OffloadState::pack(const Tensor& t) {
  if (closed_) return keep(t, nullptr);
  ++stats_.tensors_packed;
  backward_started_ = false;  // a forward: the next backward sets a new horizon
  const std::shared_ptr<Storage>& storage = t.storage();
  if (t_no_offload_depth > 0) return keep(t, &stats_.skipped_no_offload);
  if (t.is_param() || storage->tag() == MemTag::kParam || storage->is_external())
    return keep(t, &stats_.skipped_param);
  if (storage->tag() == MemTag::kGrad) return keep(t, &stats_.skipped_grad);
  if (storage->device() != opt_.device || storage->allocator() != &allocator(opt_.device))
    return keep(t, &stats_.skipped_host);
  if (t.numel() == 0 || static_cast<int64_t>(t.nbytes()) < opt_.min_offload_size)
    return keep(t, &stats_.skipped_small);

  const auto [lo, hi] = byte_span(t);
  const int64_t layer = t_layer;
  std::shared_ptr<HostCopy> copy;
  auto& known = by_storage_[storage.get()];
  for (auto it = known.begin(); it != known.end();) {
    std::shared_ptr<HostCopy> c = it->lock();
    // An expired source means a dead storage whose address was reused: not this one.
    if (!c || c->source.lock() != storage) {
      it = known.erase(it);
      continue;
    }
    if (c->begin <= lo && hi <= c->begin + c->nbytes) {
      copy = std::move(c);
      break;
    }
    ++it;
  }
  if (copy) {
    ++stats_.views_deduplicated;
    // Reload it in time for the latest layer that saved it (the first to need it in backward).
    if (layer > copy->layer) {
      copy->layer = layer;
      by_layer_[layer].push_back(copy);
    }
  } else {
    copy = offload(t, lo, hi, layer);
    known.push_back(copy);
    if (layer >= 0) by_layer_[layer].push_back(copy);
  }
  auto p = std::make_shared<Packed>();
  p->copy = std::move(copy);
  p->shape = t.shape();
  p->strides = t.strides();
  p->offset = t.offset();
  p->dtype = t.dtype();
  retire_stash();
  return p;
}

std::shared_ptr<HostCopy> OffloadState::offload(const Tensor& t, int64_t lo, int64_t hi,
                                                int64_t layer) {
  MemPhaseGuard phase(MemPhaseKind::kOffload);
  const std::shared_ptr<Storage>& source = t.storage();
  const int64_t begin = lo / kSpanAlign * kSpanAlign;
  auto c = std::make_shared<HostCopy>(shared_from_this());
  c->device = opt_.device;
  c->tag = source->tag();
  c->begin = begin;
  c->nbytes = hi - begin;
  c->layer = layer;
  c->source = source;
  c->host = std::make_shared<Storage>(static_cast<size_t>(c->nbytes), Device::cpu(),
                                      MemTag::kActivation, &pinned_allocator());
  stats_.host_bytes_current += c->nbytes;
  stats_.host_bytes_peak = std::max(stats_.host_bytes_peak, stats_.host_bytes_current);

  const Stream compute = current_stream(opt_.device);
  const Stream copy = copy_stream();
  // The producer kernel of the activation was queued on the compute stream.
  if (copy != compute) copy.wait_stream(compute);
  {
    ProfileScope prof(OpKind::kCopy, copy);
    copy_bytes_async(c->host->data(), static_cast<const char*>(source->data()) + begin, c->nbytes,
                     opt_.device, CopyKind::kDeviceToHost, copy);
  }
  // However the references are dropped (stash retired, graph freed, scope closed), neither block
  // is handed out again before the copy has finished.
  source->record_stream(copy);
  c->host->record_stream(copy);
  c->written = std::make_shared<Event>(opt_.device);
  c->written->record(copy);
  ++stats_.tensors_offloaded;
  stats_.bytes_offloaded += c->nbytes;
  if (opt_.use_streams) {
    c->stashed = source;
    stash_.push_back(StashEntry{c, c->written});
  }
  return c;
}

void OffloadState::release_stash_front() {
  if (std::shared_ptr<HostCopy> c = stash_.front().copy.lock()) c->stashed.reset();
  stash_.pop_front();
}

void OffloadState::retire_stash() {
  // Copies on one stream finish in order: the finished ones are at the front.
  while (!stash_.empty() && stash_.front().done->query()) release_stash_front();
  while (static_cast<int64_t>(stash_.size()) > opt_.max_fwd_stash_size) {
    // Back-pressure without a host stall: later compute work waits for the oldest copy.
    stash_.front().done->wait(current_stream(opt_.device));
    ++stats_.stash_waits;
    release_stash_front();
  }
}

void OffloadState::restore(HostCopy& c) {
  LT_CHECK(c.host != nullptr, "activation offloading: an offloaded tensor lost its host copy");
  MemPhaseGuard phase(MemPhaseKind::kOffload);
  const Stream compute = current_stream(c.device);
  const Stream copy = copy_stream();
  // Allocated on the compute stream: its previous user may still be queued there.
  auto buf = std::make_shared<Storage>(static_cast<size_t>(c.nbytes), c.device, c.tag);
  if (copy != compute) copy.wait_stream(compute);
  // Ordered already when both copies ran on the copy stream; not when the compute stream
  // changed in between.
  if (c.written) c.written->wait(copy);
  {
    ProfileScope prof(OpKind::kCopy, copy);
    copy_bytes_async(buf->data(), c.host->data(), c.nbytes, c.device, CopyKind::kHostToDevice,
                     copy);
  }
  buf->record_stream(copy);
  c.host->record_stream(copy);
  c.ready = std::make_unique<Event>(c.device);
  c.ready->record(copy);
  c.restored = std::move(buf);
  stats_.bytes_restored += c.nbytes;
  c.drop_host();
}

Tensor OffloadState::unpack(const std::shared_ptr<void>& packed) {
  const auto* p = static_cast<const Packed*>(packed.get());
  if (!p->copy) return p->kept;
  HostCopy& c = *p->copy;
  if (c.stashed) {
    ++stats_.stash_hits;
    return view_over(c.stashed, p->shape, p->strides, p->offset, p->dtype);
  }
  if (!c.restored) {
    restore(c);
    ++stats_.restores_on_demand;
  }
  if (c.ready) c.ready->wait(current_stream(c.device));
  const auto es = static_cast<int64_t>(dtype_size(p->dtype));
  return view_over(c.restored, p->shape, p->strides, (p->offset * es - c.begin) / es, p->dtype);
}

void OffloadState::prefetch_layer(int64_t layer) {
  auto it = by_layer_.find(layer);
  if (it == by_layer_.end()) return;
  for (const std::weak_ptr<HostCopy>& w : it->second) {
    std::shared_ptr<HostCopy> c = w.lock();
    if (!c || c->restored || c->stashed || !c->host) continue;
    restore(*c);
    ++stats_.prefetches;
  }
  by_layer_.erase(it);
}

void OffloadState::before_node(Node& node) {
  if (closed_) return;
  if (!backward_started_) {
    horizon_ = next_sequence_nr();
    backward_started_ = true;
  }
  retire_stash();
  if (!opt_.use_streams || !opt_.prefetch || ranges_.empty()) return;
  const uint64_t s = node.sequence_nr();
  if (s > horizon_) return;
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), s,
                             [](uint64_t v, const Range& r) { return v < r.begin; });
  if (it == ranges_.begin()) return;  // before the first layer (the embedding)
  --it;
  if (s < it->end) {
    // Inside layer L: its own tensors (if not yet there) and the next layer down.
    prefetch_layer(it->layer);
    prefetch_layer(it->layer - 1);
  } else {
    // After layer L in forward (between layers, or the head): layer L comes next.
    prefetch_layer(it->layer);
  }
}

int64_t OffloadState::begin_layer(int64_t layer) {
  ranges_.push_back(Range{next_sequence_nr(), std::numeric_limits<uint64_t>::max(), layer});
  return static_cast<int64_t>(ranges_.size()) - 1;
}

void OffloadState::end_layer(int64_t range) {
  if (range < 0 || range >= static_cast<int64_t>(ranges_.size())) return;
  ranges_[range].end = next_sequence_nr();
}

void OffloadState::close() {
  if (closed_) return;
  closed_ = true;
  // Copies still in flight finish before the step ends (TRL #5700: leaks without this).
  if (opt_.use_streams) side_.synchronize();
  while (!stash_.empty()) release_stash_front();
  by_storage_.clear();
  by_layer_.clear();
  ranges_.clear();
}

// ---------------------------------------------------------------- ActivationOffloader

ActivationOffloader::ActivationOffloader(const OffloadOptions& options)
    : state_(std::make_shared<OffloadState>(options)) {
  push_saved_tensor_hooks(state_);
  add_backward_observer(state_.get());
  prev_active_ = t_active;
  t_active = state_.get();
}

ActivationOffloader::~ActivationOffloader() {
  t_active = prev_active_;
  remove_backward_observer(state_.get());
  if (current_saved_tensor_hooks().get() == static_cast<SavedTensorHooks*>(state_.get()))
    pop_saved_tensor_hooks();
  try {
    state_->close();
  } catch (...) {
    // A failing stream synchronisation is reported by the next CUDA call; a destructor must
    // not throw.
  }
}

OffloadStats ActivationOffloader::stats() const { return state_->stats(); }
const OffloadOptions& ActivationOffloader::options() const { return state_->options(); }

// ---------------------------------------------------------------- scopes

OffloadLayerScope::OffloadLayerScope(int64_t layer) : prev_layer_(t_layer), owner_(t_active) {
  t_layer = layer;
  if (owner_) range_ = owner_->begin_layer(layer);
}

OffloadLayerScope::~OffloadLayerScope() {
  t_layer = prev_layer_;
  if (owner_ && owner_ == t_active) owner_->end_layer(range_);
}

NoOffloadScope::NoOffloadScope() { ++t_no_offload_depth; }
NoOffloadScope::~NoOffloadScope() { --t_no_offload_depth; }

int64_t current_offload_layer() { return t_layer; }
bool in_no_offload_scope() { return t_no_offload_depth > 0; }
bool activation_offloading_active() { return t_active != nullptr; }

}  // namespace leantune
