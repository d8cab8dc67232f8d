// ZeRO stages 1 and 2 (DeepSpeed's meanings) over the Communicator: the optimizer's states, and
// the f32 master copies of 16-bit weights, exist for 1/N of the parameters on each rank.
//
// Layout: the trainable parameters, in order, are grouped into units (consecutive parameters of
// one dtype, up to --reduce_bucket_size elements; a larger parameter is a unit of its own). Each
// unit is a flat vector padded to a multiple of N and cut into N equal slices; rank r owns slice r
// of every unit. Where a parameter meets the rank's slice, the rank holds a "piece": a view of
// those elements of the parameter, which the inner optimizer (any elementwise one: adamw_torch,
// sgd) updates in place exactly as it would update that part of the whole parameter.
//
// One update:
//   stage 1  each unit's gradients are summed over the ranks (all_reduce of the unit's flat
//            buffer); every rank has the full gradients (the norm is the single-process one).
//   stage 2  each unit's gradients are reduce-scattered: the rank keeps the sum of its slice
//            only and drops the full gradients of the unit at once. The global norm is the
//            rank-order sum of the ranks' squared slice norms.
//   then     the inner optimizer steps the pieces; each unit's updated slices are all-gathered
//            back into the parameters (every rank ends with the same full weights).
// Under --deterministic_comm every sum folds in rank order, so a run on N ranks with one
// micro-batch equals the single-process run with N micro-batches bit for bit (stage 2's norm,
// summed from slices, may differ in the last bits, which shows only when clipping applies).
// With G micro-batches per rank the sums are taken after every micro-batch (fold_micro_batch),
// folded onto the running sum, so N ranks x G equal one process x N*G bit for bit as well, at
// G collectives per update instead of one.
// Scratch: one unit's flat buffer at a time (MemTag::kComm).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/autograd.h"
#include "engine/comm.h"
#include "engine/optim.h"

namespace leantune {

// Sums tensors of one dtype on one device over the ranks through one flat buffer on that device
// (MemTag::kComm): the gradient reduction of data parallel (a bucket) and of ZeRO stage 1 (a
// unit). Host tensors need a host backend (mpi), CUDA tensors nccl. deferred: through
// Communicator::all_reduce_then (the tensors hold the sums once wait_deferred() has ordered the
// caller's stream; on the host at once).
void all_reduce_tensors(Communicator& comm, const std::vector<Tensor>& tensors,
                        bool deferred = false);

// Data parallel without ZeRO: the trainable parameters' gradients summed over the ranks in
// buckets of up to --reduce_bucket_size elements of one dtype, in parameter order (the same on
// every rank, so every rank issues the same collectives). A parameter without a gradient on
// this rank (it took no part in the loss) contributes zeros.
class GradientBuckets {
 public:
  GradientBuckets(Communicator& comm, std::vector<Tensor> params, int64_t bucket_elements);
  // Sums every bucket not summed yet during backward and waits for the sums issued during
  // backward (wait_deferred); then all buckets are pending for the next update.
  void reduce_all();
  // --deterministic_comm with several micro-batches per rank, after each micro-batch but the
  // last: sums every bucket now, then every rank but 0 drops its gradients. Rank 0's next
  // micro-batch adds to the running sum and the others' start from nothing, so the next sum
  // folds (sum + rank 0's) + rank 1's + ...: one process's order over the global micro-batches
  // (rank r reads micro-batches r, N + r, ...), bit for bit.
  void fold_micro_batch();
  // Around the last micro-batch's backward: a bucket is summed as soon as the gradient of each of
  // its parameters is complete, while backward goes on (with NCCL the sum runs on the
  // communicator's stream beside the backward kernels). Every rank runs the same graph, so
  // every rank completes the buckets in the same order.
  class BackwardReducer final : public BackwardObserver {
   public:
    explicit BackwardReducer(GradientBuckets& g);
    ~BackwardReducer() override;
    BackwardReducer(const BackwardReducer&) = delete;
    BackwardReducer& operator=(const BackwardReducer&) = delete;
    void after_node(Node& node) override;

   private:
    GradientBuckets& g_;
    std::unordered_map<const TensorImpl*, size_t> bucket_of_;
    std::vector<size_t> pending_;  // parameters per bucket whose gradient is not complete yet
  };
  // Wall seconds spent in the reductions so far.
  double comm_seconds() const { return comm_seconds_; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    int64_t elements = 0;
    bool reduced = false;
  };
  void reduce(Bucket& b);
  Communicator& comm_;
  std::vector<Tensor> params_;
  std::vector<Bucket> buckets_;
  double comm_seconds_ = 0;
};

class Zero3Params;

class ZeroOptimizer final : public Optimizer {
 public:
  // The optimizer each rank runs over its pieces (the one --optim names: the caller refuses
  // optimizers that are not elementwise, since a piece cuts across rows and blocks).
  using InnerFactory =
      std::function<std::unique_ptr<Optimizer>(std::vector<Param> pieces, const AdamWConfig& cfg)>;
  // unit_elements: --reduce_bucket_size. Stage 3 (z3 given, dist/zero3.h): the trained groups of
  // z3 are units of their own, whose pieces are views of z3's slices (updated in place, never
  // gathered here: the next use gathers them); the parameters z3 keeps whole form stage-2 units.
  ZeroOptimizer(int stage, Communicator& comm, const InnerFactory& make_inner,
                std::vector<Param> params, const AdamWConfig& cfg, int64_t unit_elements,
                const Zero3Params* z3 = nullptr);

  // Sums the gradients over the ranks (stage 1: all of them; stage 2: this rank's slices, and
  // the full gradients are dropped). Call once per update, after the last backward; units
  // already reduced during backward (BackwardReducer) are skipped.
  void reduce_gradients();
  // Drops every gradient and slice (a skipped update).
  void drop_gradients();
  // --deterministic_comm with several micro-batches per rank, after each micro-batch but the
  // last (GradientBuckets::fold_micro_batch): every unit is summed now. Stage 1: every rank but
  // 0 drops its full gradients. Stages 2 and 3: the slices accumulate through
  // reduce_scatter_accumulate, whose fold starts from the running slice.
  void fold_micro_batch();

  // Stages 2 and 3, around the last micro-batch's backward: a unit is reduce-scattered as soon as
  // the gradient of each of its parameters is complete, and its full gradients are dropped at once,
  // so the full-model gradient never exists. Every rank runs the same graph, so every rank
  // issues the same collectives in the same order.
  class BackwardReducer final : public BackwardObserver {
   public:
    explicit BackwardReducer(ZeroOptimizer& z);
    ~BackwardReducer() override;
    BackwardReducer(const BackwardReducer&) = delete;
    BackwardReducer& operator=(const BackwardReducer&) = delete;
    void after_node(Node& node) override;

   private:
    ZeroOptimizer& z_;
    std::unordered_map<const TensorImpl*, size_t> unit_of_;
    std::vector<size_t> pending_;  // parameters per unit whose gradient is not complete yet
  };
  // Global gradient norm after reduce_gradients().
  double grad_norm() const;

  size_t num_params() const override { return params_.size(); }
  const Param& param(size_t i) const override { return params_[i]; }
  // The inner optimizer's state of this rank's pieces ("<name>@<offset>.<part>").
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  // Takes this rank's pieces as state_tensors() names them (a checkpoint of the same world size),
  // or the whole "<name>.<part>" tensors of one process (a consolidated checkpoint, any world
  // size), of which it keeps the elements of its pieces.
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) override;
  int64_t state_bytes() const override;
  int stage() const { return stage_; }
  // Wall seconds spent in this optimizer's collectives so far (reductions and gathers).
  double comm_seconds() const { return comm_seconds_; }

 private:
  struct Piece {
    size_t param;      // index into params_
    int64_t begin;     // first element of the parameter in this rank's slice
    int64_t length;    // elements
    int64_t slice_at;  // offset of those elements within the rank's slice of the unit
    Tensor tensor;     // view of the parameter's elements, updated by the inner optimizer
  };
  struct Unit {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;  // of each parameter in the unit's flat vector
    int64_t elements = 0;
    int64_t slice = 0;  // elements per rank (padded)
    DType dtype = DType::kF32;
    std::vector<size_t> pieces;  // into pieces_
    Tensor grad_slice;           // stage 2: this rank's summed gradient slice
    bool reduced = false;        // in this update
    bool sharded = false;        // stage 3: the pieces are the parameters' only home
  };

  void reduce_unit(Unit& u);

  void update(const std::vector<size_t>& which, double lr, double grad_scale) override;

  int stage_;
  Communicator& comm_;
  std::vector<Param> params_;
  std::vector<Unit> units_;
  std::vector<Piece> pieces_;
  std::unique_ptr<Optimizer> inner_;
  double slice_sum_squares_ = 0;       // stage 2, this rank's part of the squared norm
  std::vector<size_t> reduced_order_;  // stage 2: units reduce-scattered, in order
  double comm_seconds_ = 0;
};

}  // namespace leantune
