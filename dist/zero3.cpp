// ZeRO stage 3's parameter residency (see zero3.h).
#include "dist/zero3.h"

#include <algorithm>
#include <chrono>

#include "engine/allocator.h"
#include "engine/check.h"

namespace leantune {
namespace {

Tensor flat_part(const Tensor& flat, int64_t off, const Tensor& t) {
  return flat.narrow(0, off, t.numel()).view(t.shape());
}

// A sharded weight's saved tensor is kept as it is (its storage is released after its use and
// restored by a gather); unpacking it has its unit gathered first. Every other saved tensor goes
// through the inner hooks (activation offloading), or is kept as it is.
class GatherOnUnpack final : public SavedTensorHooks {
 public:
  GatherOnUnpack(Zero3Params& z, std::shared_ptr<SavedTensorHooks> inner)
      : z_(z), inner_(std::move(inner)) {}
  std::shared_ptr<void> pack(const Tensor& t) override {
    auto p = std::make_shared<Packed>();
    if (inner_ && !(t.defined() && z_.is_sharded(t.storage().get())))
      p->inner = inner_->pack(t);
    else
      p->tensor = t;
    return p;
  }
  Tensor unpack(const std::shared_ptr<void>& packed) override {
    const auto& p = *static_cast<const Packed*>(packed.get());
    if (p.inner) return inner_->unpack(p.inner);
    if (p.tensor.defined()) z_.on_unpack(p.tensor.storage().get());
    return p.tensor;
  }

 private:
  struct Packed {
    Tensor tensor;
    std::shared_ptr<void> inner;
  };
  Zero3Params& z_;
  std::shared_ptr<SavedTensorHooks> inner_;
};

// Rank r's slice of a group, from its parameters' whole values.
void take_slice(Zero3Params::Group& g, int r) {
  const int64_t lo = r * g.slice, hi = lo + g.slice;
  for (size_t k = 0; k < g.params.size(); ++k) {
    const Tensor& p = g.params[k];
    const int64_t off = g.offsets[k], len = p.numel();
    const int64_t b = std::max(off, lo), e = std::min(off + len, hi);
    if (b < e)
      g.shard.narrow(0, b - lo, e - b).copy_(p.detach().view({len}).narrow(0, b - off, e - b));
  }
}

}  // namespace

Zero3Params::Zero3Params(Communicator& comm, DecoderModel& model, int64_t persistence_threshold,
                         int64_t prefetch_elements)
    : comm_(comm), model_(model), prefetch_elements_(prefetch_elements) {
  LT_CHECK_INPUT(prefetch_elements >= 0, "option stage3_prefetch_bucket_size ", prefetch_elements,
                 ": must be at least 0");
  LT_CHECK_INPUT(persistence_threshold >= 0, "option stage3_param_persistence_threshold ",
                 persistence_threshold, ": must be at least 0");
  const int n = comm_.size(), r = comm_.rank();
  auto add = [&](const std::string& name, const Tensor& t) {
    LT_CHECK(t.is_contiguous() && t.offset() == 0 && t.storage()->nbytes() == t.nbytes(),
             "zero_stage 3: parameter ", name, " shares its storage");
    const int64_t unit = ParamResidency::unit_of(name);
    const bool trainable = t.requires_grad();
    std::vector<size_t>& in_unit = unit_groups_[unit];
    size_t gi = groups_.size();
    for (size_t g : in_unit)
      if (groups_[g].trainable == trainable && groups_[g].dtype == t.dtype()) gi = g;
    if (gi == groups_.size()) {
      groups_.emplace_back();
      groups_.back().unit = unit;
      groups_.back().trainable = trainable;
      groups_.back().dtype = t.dtype();
      in_unit.push_back(gi);
    }
    Group& g = groups_[gi];
    unit_of_storage_[t.storage().get()] = unit;
    g.names.push_back(name);
    g.params.push_back(t);
    g.offsets.push_back(g.elements);
    g.elements += t.numel();
  };
  for (const auto& [name, t] : model.named_parameters()) {
    if (t.numel() <= persistence_threshold) {
      persistent_bytes_ += static_cast<int64_t>(t.nbytes());
      continue;
    }
    add(name, t);
  }
  // A quantized base is sharded or kept whole as one parameter, by its dense element count; its
  // parts (packed codes, quant state) join the unit's frozen groups of their dtypes.
  for (const LinearModule* m : model.linear_modules()) {
    if (!m->base) continue;
    const auto parts = m->base->stored_tensors();
    if (parts.empty() || m->out_features * m->in_features <= persistence_threshold) {
      persistent_bytes_ += m->base->storage_bytes();
      continue;
    }
    for (const auto& [part, t] : parts)
      if (t.defined()) add(m->name + "." + part, t);
  }
  MemTagGuard tag(MemTag::kParam);
  for (Group& g : groups_) {
    g.slice = (g.elements + n - 1) / n;
    g.shard = Tensor::zeros({g.slice}, g.dtype, model.device(), MemTag::kParam);
    take_slice(g, r);
  }
  for (const auto& [unit, gs] : unit_groups_) evict(unit);
  gathered_bytes_ = 0;  // the whole weights just given back were not a gather
  model_.set_param_residency(this);
  add_backward_observer(this);
}

Zero3Params::~Zero3Params() {
  in_flight_.clear();  // each handle completes its gather before the buffers go
  remove_backward_observer(this);
  model_.set_param_residency(nullptr);
}

bool Zero3Params::trains_sharded() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const Group& g) { return g.trainable; });
}

int64_t Zero3Params::shard_bytes() const {
  int64_t b = 0;
  for (const Group& g : groups_) b += static_cast<int64_t>(g.shard.nbytes());
  return b;
}

Zero3Params::InFlight Zero3Params::start_gather(int64_t unit) {
  InFlight f;
  const int n = comm_.size();
  MemTagGuard tag(MemTag::kComm);
  for (size_t gi : unit_groups_.at(unit)) {
    const Group& g = groups_[gi];
    f.all.push_back(Tensor::empty({g.slice * n}, g.dtype, g.shard.device(), MemTag::kComm));
    f.pending.push_back(comm_.start_all_gather(g.shard, f.all.back()));
  }
  return f;
}

int64_t Zero3Params::unit_elements(int64_t unit) const {
  int64_t e = 0;
  for (size_t gi : unit_groups_.at(unit)) e += groups_[gi].elements;
  return e;
}

void Zero3Params::follow_trace(int64_t unit) {
  // A pass that never ends (generation without backward) stops recording at a bound.
  constexpr size_t kMaxTrace = size_t{1} << 20;
  if (recording_.size() < kMaxTrace) recording_.push_back(unit);
  on_trace_ = on_trace_ && trace_pos_ < trace_.size() && trace_[trace_pos_] == unit;
  if (!on_trace_ || prefetch_elements_ == 0) return;
  ++trace_pos_;
  // The units after this one in the trace, up to the bucket's elements (the next one always).
  int64_t budget = prefetch_elements_;
  for (size_t p = trace_pos_; p < trace_.size() && budget > 0; ++p) {
    const int64_t next = trace_[p];
    if (next == unit) break;  // this unit again: it is in use, nothing beyond is needed yet
    budget -= unit_elements(next);
    if (uses_[next] > 0 || in_flight_.count(next)) continue;
    in_flight_[next] = start_gather(next);
  }
}

void Zero3Params::drain() {
  for (auto& [unit, f] : in_flight_) {
    for (auto& p : f.pending) p->wait();
    ++prefetch_unused_;
  }
  in_flight_.clear();
}

void Zero3Params::end_pass() {
  // Nothing may stay in flight past a pass: the optimizer step after it changes the slices.
  drain();
  trace_ = std::move(recording_);
  recording_.clear();
  trace_pos_ = 0;
  on_trace_ = true;
}

nlohmann::json Zero3Params::report() const {
  return {{"shard_bytes", shard_bytes()},
          {"persistent_bytes", persistent_bytes_},
          {"peak_gathered_bytes", peak_gathered_},
          {"prefetched_units", prefetch_hits_},
          {"prefetched_unused", prefetch_unused_}};
}

void Zero3Params::gather(int64_t unit) {
  const auto it = unit_groups_.find(unit);
  if (it == unit_groups_.end()) return;
  const auto start = std::chrono::steady_clock::now();
  // This unit's gather goes first, then the prefetches (on NCCL one stream orders them).
  InFlight f;
  const auto ahead = in_flight_.find(unit);
  if (ahead != in_flight_.end()) {
    f = std::move(ahead->second);
    in_flight_.erase(ahead);
    ++prefetch_hits_;
  } else {
    f = start_gather(unit);
  }
  if (!bulk_) follow_trace(unit);
  for (size_t k = 0; k < it->second.size(); ++k) {
    f.pending[k]->wait();
    Group& g = groups_[it->second[k]];
    for (size_t j = 0; j < g.params.size(); ++j) {
      Tensor p = g.params[j].detach();
      p.storage()->restore_memory();
      p.copy_(flat_part(f.all[k], g.offsets[j], p));
      gathered_bytes_ += static_cast<int64_t>(p.nbytes());
    }
  }
  peak_gathered_ = std::max(peak_gathered_, gathered_bytes_);
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Zero3Params::evict(int64_t unit) {
  const auto it = unit_groups_.find(unit);
  if (it == unit_groups_.end()) return;
  for (size_t gi : it->second)
    for (const Tensor& p : groups_[gi].params) {
      if (!p.storage()->memory_released()) gathered_bytes_ -= static_cast<int64_t>(p.nbytes());
      p.storage()->release_memory();
    }
}

void Zero3Params::acquire(int64_t unit) {
  poll_prefetches();
  if (uses_[unit]++ == 0) gather(unit);
}

void Zero3Params::release(int64_t unit) {
  int& u = uses_[unit];
  LT_CHECK(u > 0, "zero_stage 3: unit ", unit, " released more often than acquired");
  if (--u == 0) evict(unit);
}

void Zero3Params::acquire_all() {
  // Not a pass: a save or load between passes, or a whole-model generation, is not traced.
  bulk_ = true;
  for (const auto& [unit, gs] : unit_groups_) acquire(unit);
  bulk_ = false;
}

void Zero3Params::release_all() {
  for (const auto& [unit, gs] : unit_groups_) release(unit);
}

void Zero3Params::reshard_from_full() {
  drain();  // a prefetch would hold the slices being replaced
  const int r = comm_.rank();
  for (Group& g : groups_) {
    LT_CHECK(uses_[g.unit] > 0, "zero_stage 3: resharding unit ", g.unit,
             ", which is not gathered");
    take_slice(g, r);
  }
}

void Zero3Params::poll_prefetches() {
  for (auto& [unit, f] : in_flight_)
    for (auto& p : f.pending) p->poll();
}

void Zero3Params::before_node(Node& node) {
  poll_prefetches();
  const int64_t layer = node.mem_phase().layer;
  if (layer < 0 || layer == held_ || !unit_groups_.count(layer)) return;
  if (held_ != kNone) release(held_);
  acquire(layer);
  held_ = layer;
}

void Zero3Params::end_forward_only() {
  drain();
  recording_.clear();
  trace_pos_ = 0;
  on_trace_ = true;
}

void Zero3Params::end_backward() {
  if (held_ != kNone) release(held_);
  held_ = kNone;
  for (int64_t u : unpack_held_) release(u);
  unpack_held_.clear();
  end_pass();
}

std::shared_ptr<SavedTensorHooks> Zero3Params::saved_tensor_hooks(
    std::shared_ptr<SavedTensorHooks> inner) {
  return std::make_shared<GatherOnUnpack>(*this, std::move(inner));
}

void Zero3Params::on_unpack(const Storage* storage) {
  const auto it = unit_of_storage_.find(storage);
  // Nothing to do for a unit in use (the layer backward holds, or one already gathered here).
  if (it == unit_of_storage_.end() || uses_[it->second] > 0) return;
  acquire(it->second);
  unpack_held_.insert(it->second);
}

}  // namespace leantune
