// ZeRO stage 3: the parameters themselves sharded over the ranks (DeepSpeed's meaning), on top
// of the sharded optimizer of stages 1 and 2 (dist/zero.h).
//
// Units: each decoder layer, and the outer unit (token embedding, final norm and untied LM head;
// a tied head is the embedding, stored once). Within a unit, the parameters of one dtype and one
// trainability form a group: a flat vector padded to a multiple of N, of which rank r keeps slice
// r (MemTag::kParam). A trained group has the layout of a ZeroOptimizer unit, so the optimizer's
// pieces are views of this rank's slice and it updates them in place; a frozen group (a LoRA
// base) is only ever gathered. Parameters of at most `persistence_threshold` elements (norms,
// biases, LoRA adapters, which are not model parameters) are not sharded: every rank keeps them
// whole (DeepSpeed's stage3_param_persistence_threshold), and their optimizer states are
// sharded as in stage 2.
// A quantized base (QLoRA: NF4 or int8, models/quantized_linear.h) is one frozen parameter of
// its dense element count: its stored tensors (packed codes u8 / i8, quant state u8 and f32) join
// the unit's frozen groups of their dtypes, and are only ever gathered, like a LoRA base.
//
// A sharded parameter's Storage is released between uses (engine/tensor.h release_memory): the
// Tensor, and every tensor saved for backward over it, stays valid, and touching it while
// released is an Error. acquire(unit) all-gathers each of the unit's groups into one flat buffer
// (MemTag::kComm) and copies each parameter back into its restored storage; the last release
// gives the storage back.
// Forward: the model brackets each use (models/decoder.h ParamUse): a unit is gathered for its
// forward use and released after it.
// Backward: before a node created under decoder layer l (its MemPhase) runs, unit l is gathered
// and held (a BackwardObserver); it is released when backward moves on to another layer and at
// end_backward(). Gradient checkpointing's recompute runs inside the held unit. Any other node
// that saved a sharded weight in forward gets it gathered when it unpacks it: the trainer runs
// each micro-batch under saved_tensor_hooks(), which note which unit a saved tensor's storage
// belongs to. So the outer unit is gathered in backward only when a node reads it (the unfused
// head, or a sharded final norm), and held until end_backward().
// With activation offloading, the offloader's hooks see every saved tensor but the sharded
// weights (which are gathered again rather than copied to the host).
//
// Prefetch (DeepSpeed's trace-based prefetch, --stage3_prefetch_bucket_size): the units gathered
// in one pass (a micro-batch's forward and backward, since the last end_backward()) are its
// trace. When the next pass gathers the units in the same order, each gather also starts the
// gathers (Communicator::start_all_gather) of the units that follow in the trace, up to the
// bucket's elements, so they travel while this one computes. A pass that leaves the trace stops
// prefetching until the next. Every prefetch is completed by end_backward(), before an optimizer
// step can change a slice. The values are those of a synchronous gather, bit for bit.
// PEFT's trainable tokens keep their delta whole (an adapter) and read the gathered embedding.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/autograd.h"
#include "engine/comm.h"
#include "models/decoder.h"

namespace leantune {

class Zero3Params final : public ParamResidency, public BackwardObserver {
 public:
  struct Group {
    int64_t unit = 0;
    bool trainable = false;
    DType dtype = DType::kF32;
    std::vector<std::string> names;
    std::vector<Tensor> params;
    std::vector<int64_t> offsets;  // of each parameter in the group's flat vector
    int64_t elements = 0;
    int64_t slice = 0;  // elements per rank (padded)
    Tensor shard;       // this rank's slice [slice]
  };

  // Shards `model`'s parameters, which must be whole and equal on every rank (loaded from one
  // folder, or initialised from one seed), and releases the sharded ones' storage.
  // prefetch_elements: --stage3_prefetch_bucket_size (0: every gather synchronous).
  Zero3Params(Communicator& comm, DecoderModel& model, int64_t persistence_threshold,
              int64_t prefetch_elements = 0);
  ~Zero3Params() override;
  Zero3Params(const Zero3Params&) = delete;
  Zero3Params& operator=(const Zero3Params&) = delete;

  const std::vector<Group>& groups() const { return groups_; }
  // Whether a sharded parameter trains (a full fine-tune, or PEFT's modules_to_save).
  bool trains_sharded() const;
  void acquire(int64_t unit) override;
  void release(int64_t unit) override;
  // Every unit at once (saving, loading, ds3_gather_for_generation).
  void acquire_all();
  void release_all();
  // After whole values were written into the gathered parameters (loading a checkpoint): every
  // rank takes its slices from them. All units must be acquired.
  void reshard_from_full();
  // Backward is over: the units it held go back.
  void end_backward();
  // Forward passes without backward (an evaluation, a generation) are over: their prefetches
  // are completed and dropped, and the next pass follows the last training pass's trace again.
  void end_forward_only();
  void before_node(Node& node) override;
  // Hooks for the forward of a micro-batch: a saved sharded weight is kept as it is and gathered
  // when unpacked; every other saved tensor goes through `inner` (activation offloading's
  // hooks; null: kept as it is).
  std::shared_ptr<SavedTensorHooks> saved_tensor_hooks(
      std::shared_ptr<SavedTensorHooks> inner = nullptr);
  bool is_sharded(const Storage* storage) const { return unit_of_storage_.count(storage) > 0; }
  // From those hooks: the unit `storage` belongs to is gathered for the rest of backward.
  void on_unpack(const Storage* storage);

  // Bytes of this rank's slices, and of the parameters kept whole on every rank.
  int64_t shard_bytes() const;
  int64_t persistent_bytes() const { return persistent_bytes_; }
  // Parameter bytes gathered right now, and at most so far.
  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t peak_gathered_bytes() const { return peak_gathered_; }
  double comm_seconds() const { return comm_seconds_; }
  // Units whose gather was started ahead and used, and started ahead but not used (the pass left
  // the trace).
  int64_t prefetch_hits() const { return prefetch_hits_; }
  int64_t prefetch_unused() const { return prefetch_unused_; }
  // The figures above as the run report's "zero3" record (shard_bytes, persistent_bytes,
  // peak_gathered_bytes, prefetched_units, prefetched_unused).
  nlohmann::json report() const;

 private:
  struct InFlight {
    std::vector<Tensor> all;  // per group of the unit: the gathered flat vector
    std::vector<std::unique_ptr<PendingCollective>> pending;
  };
  InFlight start_gather(int64_t unit);
  void gather(int64_t unit);
  void evict(int64_t unit);
  // Records `unit` in this pass's trace and starts the prefetches that follow it in the last.
  void follow_trace(int64_t unit);
  void end_pass();
  void drain();  // completes and drops every prefetch
  // Lets the prefetches in flight advance (at each backward node and each acquisition).
  void poll_prefetches();
  int64_t unit_elements(int64_t unit) const;
  Communicator& comm_;
  DecoderModel& model_;
  std::vector<Group> groups_;
  std::map<int64_t, std::vector<size_t>> unit_groups_;
  std::map<int64_t, int> uses_;
  std::unordered_map<const Storage*, int64_t> unit_of_storage_;
  static constexpr int64_t kNone = INT64_MIN;
  int64_t held_ = kNone;           // the layer backward holds
  std::set<int64_t> unpack_held_;  // units gathered by an unpack, until end_backward()
  int64_t persistent_bytes_ = 0, gathered_bytes_ = 0, peak_gathered_ = 0;
  double comm_seconds_ = 0;
  int64_t prefetch_elements_ = 0;
  std::map<int64_t, InFlight> in_flight_;  // prefetches not consumed yet
  std::vector<int64_t> trace_, recording_;
  size_t trace_pos_ = 0;
  bool on_trace_ = true;
  bool bulk_ = false;  // inside acquire_all()
  int64_t prefetch_hits_ = 0, prefetch_unused_ = 0;
};

// Every unit of `z` gathered for a scope (a save that reads sharded weights); nothing when z is
// null.
class AllUnitsGathered {
 public:
  explicit AllUnitsGathered(Zero3Params* z) : z_(z) {
    if (z_) z_->acquire_all();
  }
  ~AllUnitsGathered() {
    if (z_) z_->release_all();
  }
  AllUnitsGathered(const AllUnitsGathered&) = delete;
  AllUnitsGathered& operator=(const AllUnitsGathered&) = delete;

 private:
  Zero3Params* z_;
};

}  // namespace leantune
