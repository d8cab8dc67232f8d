// Data-parallel gradient buckets and ZeRO stages 1 and 2 (see zero.h).
#include "dist/zero.h"

#include <chrono>
#include <cmath>

#include "dist/zero3.h"
#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/ops.h"

namespace leantune {
namespace {

// Adds the wall time of its scope to a counter.
class ScopedSeconds {
 public:
  explicit ScopedSeconds(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~ScopedSeconds() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

// Elements [off, off + t.numel()) of a flat buffer, shaped as t (same device and dtype).
Tensor flat_part(const Tensor& flat, int64_t off, const Tensor& t) {
  return flat.narrow(0, off, t.numel()).view(t.shape());
}

// A piece's name in the inner optimizer ("<param>@<offset>"; its state "<param>@<offset>.<part>",
// as dist/consolidate.h parses it).
std::string piece_name(const std::string& param, int64_t offset) {
  return param + "@" + std::to_string(offset);
}

}  // namespace

void all_reduce_tensors(Communicator& comm, const std::vector<Tensor>& tensors, bool deferred) {
  if (tensors.empty()) return;
  const DType dtype = tensors[0].dtype();
  const Device device = tensors[0].device();
  int64_t elems = 0;
  for (const Tensor& t : tensors) {
    LT_CHECK(t.dtype() == dtype && t.device() == device, "all_reduce_tensors: ", t.str(),
             " beside ", dtype_name(dtype), " tensors on ", device.str());
    elems += t.numel();
  }
  Tensor flat = Tensor::empty({elems}, dtype, device, MemTag::kComm);
  int64_t off = 0;
  for (const Tensor& t : tensors) {
    flat_part(flat, off, t).copy_(t);
    off += t.numel();
  }
  auto unpack = [flat, tensors] {
    int64_t at = 0;
    for (Tensor t : tensors) {
      t.copy_(flat_part(flat, at, t));
      at += t.numel();
    }
  };
  if (deferred) {
    comm.all_reduce_then(flat, ReduceOp::kSum, unpack);
  } else {
    comm.all_reduce(flat, ReduceOp::kSum);
    unpack();
  }
}

GradientBuckets::GradientBuckets(Communicator& comm, std::vector<Tensor> params,
                                 int64_t bucket_elements)
    : comm_(comm), params_(std::move(params)) {
  LT_CHECK_INPUT(bucket_elements > 0, "option reduce_bucket_size ", bucket_elements,
                 ": must be a positive number of elements");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const bool fits = !buckets_.empty() &&
                      params_[buckets_.back().params.back()].dtype() == p.dtype() &&
                      buckets_.back().elements + p.numel() <= bucket_elements;
    if (!fits) buckets_.push_back({});
    buckets_.back().params.push_back(i);
    buckets_.back().elements += p.numel();
  }
}

void GradientBuckets::reduce(Bucket& b) {
  b.reduced = true;
  MemTagGuard tag(MemTag::kComm);
  ScopedSeconds t(comm_seconds_);
  // Runs of one gradient dtype (a parameter without a gradient contributes zeros).
  std::vector<Tensor> run;
  for (size_t i : b.params) {
    Tensor p = params_[i];
    if (!p.grad().defined())
      p.set_grad(Tensor::zeros(p.shape(), p.dtype(), p.device(), MemTag::kGrad));
    const Tensor g = p.grad();
    if (!run.empty() && run.back().dtype() != g.dtype()) {
      all_reduce_tensors(comm_, run, true);
      run.clear();
    }
    run.push_back(g);
  }
  all_reduce_tensors(comm_, run, true);
}

void GradientBuckets::reduce_all() {
  for (Bucket& b : buckets_)
    if (!b.reduced) reduce(b);
  for (Bucket& b : buckets_) b.reduced = false;
  ScopedSeconds t(comm_seconds_);
  comm_.wait_deferred();
}

void GradientBuckets::fold_micro_batch() {
  reduce_all();
  if (comm_.rank() == 0) return;
  for (Tensor& p : params_) p.zero_grad();
}

GradientBuckets::BackwardReducer::BackwardReducer(GradientBuckets& g) : g_(g) {
  pending_.assign(g_.buckets_.size(), 0);
  for (size_t bi = 0; bi < g_.buckets_.size(); ++bi)
    for (size_t i : g_.buckets_[bi].params) {
      bucket_of_[g_.params_[i].impl()] = bi;
      ++pending_[bi];
    }
  add_backward_observer(this);
}

GradientBuckets::BackwardReducer::~BackwardReducer() { remove_backward_observer(this); }

void GradientBuckets::BackwardReducer::after_node(Node& node) {
  auto* acc = dynamic_cast<AccumulateGrad*>(&node);
  if (!acc) return;
  auto it = bucket_of_.find(acc->leaf());
  if (it == bucket_of_.end()) return;
  const size_t bi = it->second;
  bucket_of_.erase(it);  // a leaf's gradient is complete once
  if (--pending_[bi] == 0 && !g_.buckets_[bi].reduced) g_.reduce(g_.buckets_[bi]);
}

ZeroOptimizer::ZeroOptimizer(int stage, Communicator& comm, const InnerFactory& make_inner,
                             std::vector<Param> params, const AdamWConfig& cfg,
                             int64_t unit_elements, const Zero3Params* z3)
    : stage_(stage), comm_(comm), params_(std::move(params)) {
  LT_CHECK_INPUT(unit_elements > 0, "option reduce_bucket_size ", unit_elements,
                 ": must be a positive number of elements");
  LT_CHECK_INPUT(stage == 1 || stage == 2 || (stage == 3 && z3 != nullptr), "option zero_stage ",
                 stage, ": this sharded optimizer serves stages 1, 2 and 3");
  const int n_ranks = comm_.size(), r = comm_.rank();
  // Stage 3: z3's trained groups first, one unit each, with z3's layout.
  std::unordered_map<const TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < params_.size(); ++i) index_of[params_[i].tensor.impl()] = i;
  std::vector<bool> in_group(params_.size(), false);
  std::vector<const Tensor*> group_shards;  // per unit: z3's slice (nullptr: not sharded)
  if (z3) {
    for (const Zero3Params::Group& g : z3->groups()) {
      if (!g.trainable) continue;
      Unit u;
      u.dtype = g.dtype;
      u.sharded = true;
      u.elements = g.elements;
      for (size_t k = 0; k < g.params.size(); ++k) {
        const auto it = index_of.find(g.params[k].impl());
        LT_CHECK(it != index_of.end(), "zero_stage 3: ", g.names[k],
                 " trains but is not among the optimizer's parameters");
        u.params.push_back(it->second);
        u.offsets.push_back(g.offsets[k]);
        in_group[it->second] = true;
      }
      units_.push_back(std::move(u));
      group_shards.push_back(&g.shard);
    }
  }
  const size_t first_plain = units_.size();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (in_group[i]) continue;
    const Tensor& p = params_[i].tensor;
    LT_CHECK_INPUT(p.device() == params_[0].tensor.device(), "option zero_stage: parameter ",
                   params_[i].name, " is on ", p.device().str(), ", the first on ",
                   params_[0].tensor.device().str());
    LT_CHECK_INPUT(p.device().is_cpu() || comm_.backend_name() == "nccl",
                   "option zero_stage: ", "parameters on ", p.device().str(),
                   " need --comm_backend nccl (the ", comm_.backend_name(),
                   " backend moves host memory)");
    LT_CHECK(p.is_contiguous(), "zero: parameter ", params_[i].name, " is not contiguous");
    const bool fits = units_.size() > first_plain && units_.back().dtype == p.dtype() &&
                      units_.back().elements + p.numel() <= unit_elements;
    if (!fits) {
      units_.emplace_back();
      units_.back().dtype = p.dtype();
    }
    Unit& u = units_.back();
    u.params.push_back(i);
    u.offsets.push_back(u.elements);
    u.elements += p.numel();
  }
  std::vector<Param> piece_params;
  MemTagGuard tag(MemTag::kOptimizer);
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    Unit& u = units_[ui];
    u.slice = (u.elements + n_ranks - 1) / n_ranks;
    const int64_t lo = r * u.slice, hi = lo + u.slice;
    for (size_t k = 0; k < u.params.size(); ++k) {
      const Param& p = params_[u.params[k]];
      const int64_t off = u.offsets[k], n = p.tensor.numel();
      const int64_t b = std::max(off, lo), e = std::min(off + n, hi);
      if (b >= e) continue;
      Piece piece{u.params[k], b - off, e - b, b - lo, Tensor()};
      // A view of the parameter itself (stage 3: of its slice, the parameter's only home): the
      // inner optimizer updates these elements in place, and no copy of the weights exists.
      piece.tensor = u.sharded ? group_shards[ui]->narrow(0, piece.slice_at, piece.length)
                               : p.tensor.detach().view({n}).narrow(0, piece.begin, piece.length);
      piece.tensor.set_requires_grad(true);
      piece_params.push_back({piece_name(p.name, piece.begin), piece.tensor, p.decay});
      u.pieces.push_back(pieces_.size());
      pieces_.push_back(std::move(piece));
    }
  }
  inner_ = make_inner(std::move(piece_params), cfg);
}

void ZeroOptimizer::reduce_gradients() {
  for (Unit& u : units_)
    if (!u.reduced) reduce_unit(u);
  {
    ScopedSeconds t(comm_seconds_);
    comm_.wait_deferred();
  }
  // Stage 2: this rank's part of the squared norm, in the order the units were reduced.
  for (size_t ui : reduced_order_)
    for (size_t pi : units_[ui].pieces) {
      const Piece& piece = pieces_[pi];
      slice_sum_squares_ +=
          ops::sum_squares(units_[ui].grad_slice.narrow(0, piece.slice_at, piece.length));
    }
  reduced_order_.clear();
}

void ZeroOptimizer::fold_micro_batch() {
  for (Unit& u : units_)
    if (!u.reduced) reduce_unit(u);
  {
    ScopedSeconds t(comm_seconds_);
    comm_.wait_deferred();
  }
  for (Unit& u : units_) u.reduced = false;
  if (stage_ == 1 && comm_.rank() != 0)
    for (Param& p : params_) p.tensor.zero_grad();
}

void ZeroOptimizer::drop_gradients() {
  for (Unit& u : units_) {
    u.grad_slice = Tensor();
    u.reduced = false;
  }
  for (Piece& p : pieces_) p.tensor.zero_grad();
  slice_sum_squares_ = 0;
  reduced_order_.clear();
}

void ZeroOptimizer::reduce_unit(Unit& u) {
  MemTagGuard tag(MemTag::kComm);
  const int n_ranks = comm_.size();
  u.reduced = true;
  // The dtype of the unit's gradients (they may differ from the weights', e.g. f32 for bf16).
  DType gdt = u.dtype;
  bool first = true;
  for (size_t i : u.params) {
    Tensor g = params_[i].tensor.grad();
    if (!g.defined()) continue;
    LT_CHECK(first || g.dtype() == gdt, "zero: gradients of one unit in different dtypes");
    gdt = g.dtype();
    first = false;
  }
  if (stage_ == 1) {  // every rank keeps the whole summed gradient
    std::vector<Tensor> grads;
    for (size_t i : u.params) {
      Tensor& p = params_[i].tensor;
      if (!p.grad().defined()) p.set_grad(Tensor::zeros(p.shape(), gdt, p.device(), MemTag::kGrad));
      grads.push_back(p.grad());
    }
    ScopedSeconds t(comm_seconds_);
    all_reduce_tensors(comm_, grads, true);
    return;
  }
  // Stage 2: the unit's gradients in one flat buffer padded to N slices (zeros for a parameter
  // without one, and for the padding), reduce-scattered.
  const Device dev = params_[u.params[0]].tensor.device();
  Tensor flat = Tensor::zeros({u.slice * n_ranks}, gdt, dev, MemTag::kComm);
  for (size_t k = 0; k < u.params.size(); ++k) {
    Tensor g = params_[u.params[k]].tensor.grad();
    if (!g.defined()) continue;
    flat_part(flat, u.offsets[k], g).copy_(g);
  }
  // Only the slice stays: the full gradients go before the slice is allocated.
  for (size_t i : u.params) params_[i].tensor.zero_grad();
  if (u.grad_slice.defined()) {
    // A later micro-batch of fold_micro_batch(): onto the running slice, in rank order.
    ScopedSeconds t(comm_seconds_);
    comm_.reduce_scatter_accumulate(flat, u.grad_slice);
    return;
  }
  u.grad_slice = Tensor::empty({u.slice}, gdt, dev, MemTag::kGrad);
  {
    // Deferred: on CUDA the sum runs beside the rest of backward; its norm is taken in
    // reduce_gradients() once every unit is in.
    ScopedSeconds t(comm_seconds_);
    comm_.reduce_scatter_then(flat, u.grad_slice, ReduceOp::kSum, [] {});
  }
  reduced_order_.push_back(static_cast<size_t>(&u - units_.data()));
}

ZeroOptimizer::BackwardReducer::BackwardReducer(ZeroOptimizer& z) : z_(z) {
  pending_.assign(z_.units_.size(), 0);
  for (size_t ui = 0; ui < z_.units_.size(); ++ui)
    for (size_t i : z_.units_[ui].params) {
      unit_of_[z_.params_[i].tensor.impl()] = ui;
      ++pending_[ui];
    }
  add_backward_observer(this);
}

ZeroOptimizer::BackwardReducer::~BackwardReducer() { remove_backward_observer(this); }

void ZeroOptimizer::BackwardReducer::after_node(Node& node) {
  auto* acc = dynamic_cast<AccumulateGrad*>(&node);
  if (!acc) return;
  auto it = unit_of_.find(acc->leaf());
  if (it == unit_of_.end()) return;
  const size_t ui = it->second;
  unit_of_.erase(it);  // a leaf's gradient is complete once
  if (--pending_[ui] == 0 && !z_.units_[ui].reduced) z_.reduce_unit(z_.units_[ui]);
}

double ZeroOptimizer::grad_norm() const {
  if (stage_ == 1) {
    double s = 0;
    for (const Param& p : params_) {
      Tensor g = p.tensor.grad();
      if (g.defined()) s += ops::sum_squares(g);
    }
    return std::sqrt(s);
  }
  return std::sqrt(comm_.all_reduce_scalar(slice_sum_squares_));
}

void ZeroOptimizer::update(const std::vector<size_t>&, double lr, double grad_scale) {
  // Each piece's gradient: its part of the summed gradient.
  for (Unit& u : units_) {
    for (size_t pi : u.pieces) {
      Piece& piece = pieces_[pi];
      Tensor g;
      if (stage_ == 1) {
        Tensor full = params_[piece.param].tensor.grad();
        LT_CHECK(full.defined(), "zero: no gradient for ", params_[piece.param].name);
        g = full.view({full.numel()}).narrow(0, piece.begin, piece.length);
      } else {
        LT_CHECK(u.grad_slice.defined(), "zero: reduce_gradients() was not called");
        g = u.grad_slice.narrow(0, piece.slice_at, piece.length);
      }
      piece.tensor.set_grad(g.contiguous());
    }
  }
  inner_->step(lr, grad_scale);
  // The updated slices, gathered back into every rank's parameters.
  MemTagGuard tag(MemTag::kComm);
  const int n_ranks = comm_.size();
  for (Unit& u : units_) {
    if (u.sharded) continue;  // stage 3: the slices are the parameters; the next use gathers
    const Device dev = params_[u.params[0]].tensor.device();
    Tensor mine = Tensor::zeros({u.slice}, u.dtype, dev, MemTag::kComm);
    for (size_t pi : u.pieces) {
      const Piece& piece = pieces_[pi];
      flat_part(mine, piece.slice_at, piece.tensor).copy_(piece.tensor.detach());
    }
    Tensor all = Tensor::empty({u.slice * n_ranks}, u.dtype, dev, MemTag::kComm);
    {
      ScopedSeconds t(comm_seconds_);
      comm_.all_gather(mine, all);
    }
    for (size_t k = 0; k < u.params.size(); ++k) {
      Tensor p = params_[u.params[k]].tensor.detach();
      p.copy_(flat_part(all, u.offsets[k], p));
    }
  }
  drop_gradients();
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::state_tensors() const {
  return inner_->state_tensors();
}

void ZeroOptimizer::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) {
  // This rank's own pieces ("<param>@<offset>.<part>", a checkpoint of the same world size), or
  // the whole "<param>.<part>" tensors of one process (any world size), narrowed to the pieces.
  std::unordered_map<std::string, size_t> param_of;
  for (size_t i = 0; i < params_.size(); ++i) param_of[params_[i].name] = i;
  std::unordered_map<size_t, std::vector<size_t>> pieces_of;
  for (size_t k = 0; k < pieces_.size(); ++k) pieces_of[pieces_[k].param].push_back(k);
  std::vector<std::pair<std::string, Tensor>> mine;
  for (const auto& [name, t] : state) {
    const size_t dot = name.rfind('.');
    auto it = dot == std::string::npos ? param_of.end() : param_of.find(name.substr(0, dot));
    if (name.find('@') != std::string::npos || it == param_of.end()) {
      mine.emplace_back(name, t);
      continue;
    }
    const Param& p = params_[it->second];
    LT_CHECK_INPUT(t.numel() == p.tensor.numel() && t.is_contiguous(), "optimizer state '", name,
                   "' is ", t.str(), ", parameter ", p.name, " has ", p.tensor.numel(),
                   " elements");
    for (size_t k : pieces_of[it->second]) {
      const Piece& piece = pieces_[k];
      mine.emplace_back(piece_name(p.name, piece.begin) + name.substr(dot),
                        t.view({t.numel()}).narrow(0, piece.begin, piece.length));
    }
  }
  inner_->load_state_tensors(mine);
  inner_->set_step_count(step_count());
}

int64_t ZeroOptimizer::state_bytes() const { return inner_->state_bytes(); }

}  // namespace leantune
