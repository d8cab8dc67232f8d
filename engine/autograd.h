// Autograd: a dynamic graph of coarse nodes with hand-written backward.
//
// An op that supports gradients creates a Node subclass when any input requires grad and grad
// mode is on: it stores the next edges (one per differentiable input) and saves what backward
// needs through SavedTensor, then attaches itself to its outputs with set_history().
//
//   auto node = std::make_shared<MyOpBackward>();
//   if (node_needed({x, w})) { node->set_next_edges({x, w}); node->x = SavedTensor(x); ... }
//   set_history(out, node);   // no-op when node has no edges
//
// backward(): nodes run in reverse creation order once all their gradients are in; leaf
// gradients accumulate into tensor.grad() (allocated with MemTag::kGrad). Saved tensors of a
// node are released as soon as it has run (unless retain_graph).
//
// SavedTensor passes through the active saved-tensor hook stack (pack on save, unpack on use);
// activation offloading and checkpointing are hooks on this one mechanism. A saved tensor keeps
// data only (its autograd history is dropped), so saving an op's own output is cycle-free.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/mem_phase.h"
#include "engine/scope_guard.h"
#include "engine/tensor.h"

namespace leantune {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  // grads.size() == num_outputs(); an undefined Tensor stands for a zero gradient.
  // Returns one gradient per next edge (undefined where none flows).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors after backward has used them.
  virtual void release_saved() {}

  void set_next_edges(const std::vector<Tensor>& inputs);
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  uint64_t sequence_nr() const { return sequence_nr_; }
  // The allocation phase the node was created in (engine/mem_phase.h).
  MemPhase mem_phase() const { return mem_phase_; }
  // The allocation site of this node's backward: its name after the forward site it was created
  // in ("mlp: LinearBackward"); interned on first use.
  uint16_t backward_mem_site();
  uint32_t num_outputs() const { return num_outputs_; }
  void set_num_outputs(uint32_t n) { num_outputs_ = n; }
  // True when input i of the forward op needs a gradient.
  bool needs_input_grad(size_t i) const { return i < next_edges_.size() && next_edges_[i].valid(); }

 protected:
  std::vector<Edge> next_edges_;

 private:
  uint64_t sequence_nr_;
  MemPhase mem_phase_;
  uint16_t mem_site_ = 0;            // the forward site at creation
  uint16_t backward_site_ = 0xffff;  // not yet interned
  uint32_t num_outputs_ = 1;
};

// Gradient accumulation into a leaf tensor.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  TensorImpl* leaf() const { return leaf_.get(); }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

bool grad_mode_enabled();
void set_grad_mode(bool on);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_mode_enabled()) { set_grad_mode(false); }
  ~NoGradGuard() { set_grad_mode(prev_); }

 private:
  bool prev_;
};
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(grad_mode_enabled()) { set_grad_mode(true); }
  ~EnableGradGuard() { set_grad_mode(prev_); }

 private:
  bool prev_;
};

// True when grad mode is on and some input requires grad.
bool node_needed(const std::vector<Tensor>& inputs);
// Attaches `node` as the producer of `outputs` (output i gets output_nr i). No-op when the
// node has no valid next edge.
void set_history(const std::vector<Tensor>& outputs, const std::shared_ptr<Node>& node);
inline void set_history(const Tensor& out, const std::shared_ptr<Node>& node) {
  set_history(std::vector<Tensor>{out}, node);
}
// The edge through which a gradient for `t` flows (invalid when t does not require grad).
Edge gradient_edge(const Tensor& t);

// ---- saved tensors and hooks

class SavedTensorHooks {
 public:
  virtual ~SavedTensorHooks() = default;
  // Called when a node saves `t`; returns an opaque handle from which unpack() restores it.
  virtual std::shared_ptr<void> pack(const Tensor& t) = 0;
  virtual Tensor unpack(const std::shared_ptr<void>& packed) = 0;
};

void push_saved_tensor_hooks(std::shared_ptr<SavedTensorHooks> hooks);
void pop_saved_tensor_hooks();
std::shared_ptr<SavedTensorHooks> current_saved_tensor_hooks();

class SavedTensorHooksGuard : ScopeGuard {
 public:
  explicit SavedTensorHooksGuard(std::shared_ptr<SavedTensorHooks> hooks) {
    push_saved_tensor_hooks(std::move(hooks));
  }
  ~SavedTensorHooksGuard() { pop_saved_tensor_hooks(); }
};

class SavedTensor {
 public:
  SavedTensor() = default;
  // Saves t (data only) through the current hooks, if any.
  explicit SavedTensor(const Tensor& t);
  Tensor unpack() const;
  void reset();
  bool defined() const { return defined_; }

 private:
  bool defined_ = false;
  Tensor tensor_;                 // when no hooks were active
  std::shared_ptr<void> packed_;  // when hooks were active
  std::shared_ptr<SavedTensorHooks> hooks_;
};

// ---- running backward

// Runs backward from `roots` with the given gradients (undefined = ones for a scalar root).
// Where two gradients for one input meet, the sum is formed in place into the first when nothing
// else holds it (a + b either way, so the values are those of a fresh sum).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {},
              bool retain_graph = false);
// The same from the roots' gradient edges (gradient_edge(root)): a caller that recomputed the
// roots may drop their data before backward runs (checkpoint() does). Every gradient is given;
// each is released as soon as its node has run (pass them with std::move).
void backward_from_edges(const std::vector<Edge>& roots, std::vector<Tensor> grads);

// While a LeafGradCapture lives on this thread, backward() hands the gradient each leaf would
// receive to the capture instead of accumulating it into the leaf's grad(), and runs no backward
// observer for that leaf (an optimizer in backward or a gradient reducer, which take a leaf's
// gradient as complete when it arrives, see it once, from whoever takes the captured sum on).
// Gradients for one leaf over several backward passes are summed: in the leaf's dtype for
// f32/f64, in f32 for 16-bit leaves (one rounding when taken). Captures nest (the innermost one
// captures).
class LeafGradCapture : ScopeGuard {
 public:
  LeafGradCapture();
  ~LeafGradCapture();
  // Adds g to what was captured for `leaf`.
  void add(const TensorImpl* leaf, Tensor g);
  // The sum captured for `leaf` (undefined when none arrived), removed from the capture. With
  // `dtype` set the sum comes in that dtype.
  Tensor take(const TensorImpl* leaf, std::optional<DType> dtype = std::nullopt);

 private:
  std::unordered_map<const TensorImpl*, Tensor> grads_;
  LeafGradCapture* prev_;
};

// Hooks called by the engine around each node in backward (offloading uses them to prefetch
// and release). Called in execution order.
class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  virtual void before_node(Node& node) {}
  virtual void after_node(Node& node) {}
};
void add_backward_observer(BackwardObserver* obs);
void remove_backward_observer(BackwardObserver* obs);

// ---- checkpointing

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
// Runs fn(inputs) without keeping its intermediate saved tensors: only `inputs` are saved
// (through the hooks, so an offloading hook moves them), and fn is run again during backward
// to rebuild what its backward needs. Random state used inside fn (dropout) is replayed
// exactly. Gradients equal those without checkpointing.
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

// The hooks a recompute runs under (checkpoint(), engine/tiled.h): every saved tensor stays where
// it is, since it is used right away.
std::shared_ptr<SavedTensorHooks> keep_in_place_hooks();
// Random state of every registered ReplayableState (below): captured, and restored in the same
// order.
std::vector<std::shared_ptr<void>> capture_replayable_states();
void restore_replayable_states(const std::vector<std::shared_ptr<void>>& states);

// Random-state capture for replay under checkpoint(): ops that draw random numbers during a
// differentiable forward register their generator state here.
class ReplayableState {
 public:
  virtual ~ReplayableState() = default;
  virtual std::shared_ptr<void> capture() = 0;
  virtual void restore(const std::shared_ptr<void>& state) = 0;
};
void register_replayable_state(ReplayableState* s);

}  // namespace leantune
