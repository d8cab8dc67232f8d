// The autograd graph, the saved-tensor hook stack and checkpoint regions (see autograd.h).
#include "engine/autograd.h"

#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

#include "engine/ops.h"

namespace leantune {

namespace {
std::atomic<uint64_t> g_sequence{0};
thread_local bool t_grad_mode = true;
thread_local std::vector<std::shared_ptr<SavedTensorHooks>> t_hooks;
std::vector<BackwardObserver*> g_observers;
std::vector<ReplayableState*> g_replayable;
}  // namespace

Node::Node()
    : sequence_nr_(g_sequence++), mem_phase_(current_mem_phase()), mem_site_(current_mem_site()) {}

uint16_t Node::backward_mem_site() {
  if (backward_site_ == 0xffff) {
    const std::string& fwd = mem_site_name(mem_site_);
    backward_site_ = mem_site_id(fwd.empty() ? name() : fwd + ": " + name());
  }
  return backward_site_;
}

bool grad_mode_enabled() { return t_grad_mode; }
void set_grad_mode(bool on) { t_grad_mode = on; }

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  if (!impl->requires_grad) return {};
  std::shared_ptr<Node> acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl->grad_accumulator = acc;
  }
  return {acc, 0};
}

void Node::set_next_edges(const std::vector<Tensor>& inputs) {
  next_edges_.clear();
  next_edges_.reserve(inputs.size());
  for (const Tensor& t : inputs) next_edges_.push_back(gradient_edge(t));
}

bool node_needed(const std::vector<Tensor>& inputs) {
  if (!t_grad_mode) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void set_history(const std::vector<Tensor>& outputs, const std::shared_ptr<Node>& node) {
  if (!node) return;
  bool any = false;
  for (const Edge& e : node->next_edges()) any = any || e.valid();
  if (!any) return;
  node->set_num_outputs(static_cast<uint32_t>(outputs.size()));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) continue;
    outputs[i].impl()->grad_fn = node;
    outputs[i].impl()->output_nr = static_cast<uint32_t>(i);
  }
}

// ---------------------------------------------------------------- AccumulateGrad

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  LT_CHECK(g.shape() == leaf_->shape, "gradient ", g.str(), " for leaf ", shape_str(leaf_->shape));
  Tensor& acc = leaf_->grad;
  const DType want = leaf_->grad_dtype_set ? leaf_->grad_dtype : leaf_->dtype;
  if (!acc.defined()) {
    // Take the incoming buffer when nobody else can see it; otherwise copy.
    const bool unique = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 &&
                        g.is_contiguous() && g.offset() == 0 &&
                        g.storage()->nbytes() == g.nbytes() && g.dtype() == want;
    if (unique) {
      g.storage()->set_tag(MemTag::kGrad);
      acc = g;
    } else {
      acc = Tensor::empty(g.shape(), want, g.device(), MemTag::kGrad);
      ops::copy(acc, g);
    }
  } else {
    ops::add_(acc, g);
  }
  return {};
}

// ---------------------------------------------------------------- saved tensors

void push_saved_tensor_hooks(std::shared_ptr<SavedTensorHooks> hooks) {
  t_hooks.push_back(std::move(hooks));
}
void pop_saved_tensor_hooks() {
  LT_CHECK(!t_hooks.empty(), "pop of an empty saved-tensor hook stack");
  t_hooks.pop_back();
}
std::shared_ptr<SavedTensorHooks> current_saved_tensor_hooks() {
  return t_hooks.empty() ? nullptr : t_hooks.back();
}

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  defined_ = true;
  hooks_ = current_saved_tensor_hooks();
  if (hooks_)
    packed_ = hooks_->pack(t.detach());
  else
    tensor_ = t.detach();
}

Tensor SavedTensor::unpack() const {
  if (!defined_) return Tensor();
  if (hooks_) {
    LT_CHECK(packed_ != nullptr, "saved tensor used after it was released (backward twice?)");
    return hooks_->unpack(packed_);
  }
  LT_CHECK(tensor_.defined(), "saved tensor used after it was released (backward twice?)");
  return tensor_;
}

void SavedTensor::reset() {
  tensor_ = Tensor();
  packed_.reset();
}

// ---------------------------------------------------------------- engine

void add_backward_observer(BackwardObserver* obs) { g_observers.push_back(obs); }
void remove_backward_observer(BackwardObserver* obs) {
  g_observers.erase(std::remove(g_observers.begin(), g_observers.end(), obs), g_observers.end());
}

namespace {
thread_local LeafGradCapture* t_capture = nullptr;

// `acc` += g in place when `acc` is the only handle to its bytes (a + b: the values of a fresh
// sum), else a fresh sum.
void sum_into(Tensor& acc, const Tensor& g) {
  const bool sole = sole_contiguous(acc) && acc.offset() == 0 && g.dtype() == acc.dtype() &&
                    g.shape() == acc.shape() && !acc.requires_grad();
  if (sole)
    ops::add_(acc, g);
  else
    acc = ops::add(acc, g);
}

void run_backward(const std::vector<Edge>& root_edges, std::vector<Tensor> root_grads,
                  bool retain_graph);
}  // namespace

LeafGradCapture::LeafGradCapture() : prev_(t_capture) { t_capture = this; }
LeafGradCapture::~LeafGradCapture() { t_capture = prev_; }

void LeafGradCapture::add(const TensorImpl* leaf, Tensor g) {
  if (!g.defined()) return;
  auto it = grads_.find(leaf);
  if (it == grads_.end()) {
    grads_.emplace(leaf, std::move(g));
    return;
  }
  Tensor& acc = it->second;
  // A second pass: the sum is formed in the accumulation dtype, in a buffer of its own.
  const DType want = dtype_size(acc.dtype()) == 2 ? DType::kF32 : acc.dtype();
  const bool own = acc.dtype() == want && acc.impl_ptr().use_count() == 1 &&
                   acc.storage().use_count() == 1 && acc.is_contiguous() && acc.offset() == 0;
  if (!own) {
    Tensor fresh = Tensor::empty(acc.shape(), want, acc.device(), MemTag::kGrad);
    ops::copy(fresh, acc);
    acc = fresh;
  }
  if (g.dtype() == want) {
    ops::add_(acc, g);
  } else {
    Tensor gw = Tensor::empty(g.shape(), want, g.device(), MemTag::kWorkspace);
    ops::copy(gw, g);
    ops::add_(acc, gw);
  }
}

Tensor LeafGradCapture::take(const TensorImpl* leaf, std::optional<DType> dtype) {
  auto it = grads_.find(leaf);
  if (it == grads_.end()) return Tensor();
  Tensor g = std::move(it->second);
  grads_.erase(it);
  if (dtype && g.dtype() != *dtype) {
    Tensor c = Tensor::empty(g.shape(), *dtype, g.device(), MemTag::kGrad);
    ops::copy(c, g);
    g = c;
  }
  return g;
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph) {
  LT_CHECK(grads.empty() || grads.size() == roots.size(), "backward: ", roots.size(), " roots and ",
           grads.size(), " gradients");
  std::vector<Edge> root_edges;
  std::vector<Tensor> gs;
  for (size_t i = 0; i < roots.size(); ++i) {
    Edge e = gradient_edge(roots[i]);
    LT_CHECK(e.valid(), "backward on ", roots[i].str(), " which does not require grad");
    root_edges.push_back(e);
    Tensor g = grads.empty() ? Tensor() : grads[i];
    if (!g.defined()) {
      LT_CHECK(roots[i].numel() == 1, "backward on non-scalar ", roots[i].str(),
               " needs an explicit gradient");
      g = Tensor::full(roots[i].shape(), 1.0, roots[i].dtype(), roots[i].device());
    }
    LT_CHECK(g.shape() == roots[i].shape(), "gradient ", g.str(), " for root ", roots[i].str());
    gs.push_back(std::move(g));
  }
  run_backward(root_edges, std::move(gs), retain_graph);
}

void backward_from_edges(const std::vector<Edge>& roots, std::vector<Tensor> grads) {
  LT_CHECK(grads.size() == roots.size(), "backward: ", roots.size(), " root edges and ",
           grads.size(), " gradients");
  for (size_t i = 0; i < roots.size(); ++i)
    LT_CHECK(roots[i].valid() && grads[i].defined(), "backward: root edge ", i,
             " without a node or a gradient");
  run_backward(roots, std::move(grads), false);
}

namespace {
void run_backward(const std::vector<Edge>& root_edges, std::vector<Tensor> root_grads,
                  bool retain_graph) {
  struct State {
    std::vector<Tensor> inputs;
    int deps = 0;
  };
  std::unordered_map<Node*, State> state;
  std::vector<std::shared_ptr<Node>> keep;  // keeps nodes alive while the graph is torn down

  auto add_grad = [&](Node* n, uint32_t slot, Tensor g) {
    auto& in = state[n].inputs;
    if (in.size() < n->num_outputs()) in.resize(n->num_outputs());
    LT_CHECK(slot < in.size(), "gradient slot ", slot, " of ", n->name());
    if (!in[slot].defined())
      in[slot] = std::move(g);
    else
      sum_into(in[slot], g);
  };

  // Dependencies: number of edges reaching each node from the roots' subgraph.
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const Edge& e : root_edges) {
    if (!seen[e.fn.get()]) {
      seen[e.fn.get()] = true;
      stack.push_back(e.fn.get());
      keep.push_back(e.fn);
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      state[e.fn.get()].deps++;
      if (!seen[e.fn.get()]) {
        seen[e.fn.get()] = true;
        stack.push_back(e.fn.get());
        keep.push_back(e.fn);
      }
    }
  }

  for (size_t i = 0; i < root_edges.size(); ++i)
    add_grad(root_edges[i].fn.get(), root_edges[i].input_nr, std::move(root_grads[i]));
  root_grads.clear();

  auto later_first = [](Node* a, Node* b) { return a->sequence_nr() < b->sequence_nr(); };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  for (const Edge& e : root_edges) {
    State& s = state[e.fn.get()];
    if (s.deps == 0) {
      s.deps = -1;  // queued
      ready.push(e.fn.get());
    }
  }

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    // Allocations of this node's backward are attributed to its forward layer's backward.
    MemPhaseGuard phase(backward_phase_of(n->mem_phase()));
    MemSiteGuard site(mem_sites_wanted() ? n->backward_mem_site() : uint16_t{0});
    std::vector<Tensor> in = std::move(state[n].inputs);
    in.resize(n->num_outputs());
    bool any = false;
    for (const Tensor& t : in) any = any || t.defined();
    auto* acc = t_capture ? dynamic_cast<AccumulateGrad*>(n) : nullptr;
    std::vector<Tensor> out;
    if (acc) {
      if (any) t_capture->add(acc->leaf(), std::move(in[0]));
      continue;  // a leaf has no next edges
    }
    if (any) {
      for (BackwardObserver* o : g_observers) o->before_node(*n);
      out = n->apply(std::move(in));
      for (BackwardObserver* o : g_observers) o->after_node(*n);
    }
    in.clear();
    if (!retain_graph) n->release_saved();
    const auto& edges = n->next_edges();
    if (any && !dynamic_cast<AccumulateGrad*>(n))
      LT_CHECK(out.size() == edges.size(), n->name(), " returned ", out.size(), " gradients for ",
               edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      if (any && i < out.size() && out[i].defined())
        add_grad(e.fn.get(), e.input_nr, std::move(out[i]));
      State& s = state[e.fn.get()];
      if (--s.deps == 0) {
        s.deps = -1;
        ready.push(e.fn.get());
      }
    }
  }
}
}  // namespace

// ---------------------------------------------------------------- checkpoint

void register_replayable_state(ReplayableState* s) {
  if (std::find(g_replayable.begin(), g_replayable.end(), s) == g_replayable.end())
    g_replayable.push_back(s);
}

namespace {
// During recomputation nothing is offloaded: tensors are used right away.
class KeepHooks final : public SavedTensorHooks {
 public:
  std::shared_ptr<void> pack(const Tensor& t) override { return std::make_shared<Tensor>(t); }
  Tensor unpack(const std::shared_ptr<void>& p) override { return *static_cast<Tensor*>(p.get()); }
};
}  // namespace

std::shared_ptr<SavedTensorHooks> keep_in_place_hooks() { return std::make_shared<KeepHooks>(); }

std::vector<std::shared_ptr<void>> capture_replayable_states() {
  std::vector<std::shared_ptr<void>> states;
  for (auto* r : g_replayable) states.push_back(r->capture());
  return states;
}

void restore_replayable_states(const std::vector<std::shared_ptr<void>>& states) {
  for (size_t i = 0; i < g_replayable.size() && i < states.size(); ++i)
    g_replayable[i]->restore(states[i]);
}

namespace {
class CheckpointBackward final : public Node {
 public:
  CheckpointFn fn;
  std::vector<SavedTensor> inputs;
  std::vector<bool> input_requires_grad;
  std::vector<std::shared_ptr<void>> rng_states;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> in;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor t = inputs[i].unpack().detach();
      if (input_requires_grad[i]) t.set_requires_grad(true);
      in.push_back(t);
    }
    const std::vector<std::shared_ptr<void>> now = capture_replayable_states();
    restore_replayable_states(rng_states);
    std::vector<Tensor> outs;
    {
      EnableGradGuard eg;
      SavedTensorHooksGuard keep(keep_in_place_hooks());
      outs = fn(in);
    }
    restore_replayable_states(now);
    LT_CHECK(outs.size() == grads.size(), "checkpointed function returned ", outs.size(),
             " outputs on recompute, ", grads.size(), " the first time");
    std::vector<Edge> roots;
    std::vector<Tensor> gs;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (grads[i].defined() && outs[i].requires_grad()) {
        roots.push_back(gradient_edge(outs[i]));
        gs.push_back(std::move(grads[i]));
      }
    }
    // Backward needs the outputs' nodes, not their values: the recomputed outputs go now.
    outs.clear();
    grads.clear();
    if (!roots.empty()) backward_from_edges(roots, std::move(gs));
    roots.clear();
    std::vector<Tensor> result;
    for (size_t i = 0; i < in.size(); ++i) {
      Tensor g = input_requires_grad[i] ? in[i].grad() : Tensor();
      if (g.defined()) g.storage()->set_tag(MemTag::kActivation);
      result.push_back(g);
    }
    return result;
  }
  std::string name() const override { return "CheckpointBackward"; }
  void release_saved() override {
    for (auto& s : inputs) s.reset();
  }
};
}  // namespace

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  std::vector<std::shared_ptr<void>> rng = capture_replayable_states();
  std::vector<Tensor> detached;
  for (const Tensor& t : inputs) detached.push_back(t.defined() ? t.detach() : t);
  std::vector<Tensor> outs;
  {
    NoGradGuard ng;
    outs = fn(detached);
  }
  if (!grad_mode_enabled()) return outs;
  auto node = std::make_shared<CheckpointBackward>();
  node->fn = fn;
  node->rng_states = std::move(rng);
  node->set_next_edges(inputs);
  for (const Tensor& t : inputs) {
    node->inputs.emplace_back(t);
    node->input_requires_grad.push_back(t.defined() && t.requires_grad());
  }
  // Attached even when no input requires grad: parameters inside fn may.
  node->set_num_outputs(static_cast<uint32_t>(outs.size()));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].defined() || !dtype_is_floating(outs[i].dtype())) continue;
    // A fresh impl so that an output aliasing an input does not rewrite the input's history.
    outs[i] = outs[i].detach();
    outs[i].impl()->grad_fn = node;
    outs[i].impl()->output_nr = static_cast<uint32_t>(i);
  }
  return outs;
}

}  // namespace leantune
