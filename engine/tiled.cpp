// tiled_rows: a row-independent region computed block by block (contract in engine/tiled.h).
#include "engine/tiled.h"

#include <algorithm>
#include <unordered_set>

#include "engine/ops.h"
#include "engine/rng.h"

namespace leantune {

namespace {

// Node sequence numbers come from one engine-wide counter; a throwaway node reads it.
class SequenceMark final : public Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&&) override { return {}; }
  std::string name() const override { return "SequenceMark"; }
};

std::vector<Tensor> block_of(const std::vector<Tensor>& full, int64_t r0, int64_t n,
                             const std::vector<bool>* leaves) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < full.size(); ++i) {
    Tensor t = full[i].detach().narrow(0, r0, n);
    if (leaves && (*leaves)[i]) t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

// The parameter leaves a block's graph reaches (the block's own inputs excluded), as edges to
// their accumulators, in the order first met. Nodes older than `first` belong to a graph from
// outside fn, which the region cannot hand a gradient to.
std::vector<Edge> leaf_edges(const std::vector<Tensor>& outs, const std::vector<Tensor>& block_in,
                             uint64_t first) {
  std::unordered_set<const TensorImpl*> own;
  for (const Tensor& t : block_in) own.insert(t.impl());
  std::vector<Edge> leaves;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  for (const Tensor& o : outs)
    if (o.defined() && o.grad_fn() && seen.insert(o.grad_fn().get()).second)
      stack.push_back(o.grad_fn().get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid() || !seen.insert(e.fn.get()).second) continue;
      if (auto* acc = dynamic_cast<AccumulateGrad*>(e.fn.get())) {
        if (!own.count(acc->leaf())) leaves.push_back(e);
        continue;
      }
      LT_CHECK(e.fn->sequence_nr() >= first, "tiled_rows: the region reads a tensor with autograd ",
               "history from outside it (", e.fn->name(), "); pass it as an input");
      stack.push_back(e.fn.get());
    }
  }
  return leaves;
}

class TiledRowsBackward final : public Node {
 public:
  CheckpointFn fn;
  int64_t chunk = 0, rows = 0;
  std::vector<SavedTensor> inputs;
  std::vector<bool> input_grad;
  std::vector<std::shared_ptr<void>> rng;  // the replayable random state at the region's start

  void set_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> full;
    for (const SavedTensor& s : inputs) full.push_back(s.unpack());
    const size_t n_in = full.size();
    std::vector<Tensor> dinputs(n_in);
    for (size_t i = 0; i < n_in; ++i)
      if (input_grad[i] && needs_input_grad(i))
        dinputs[i] = Tensor::empty(full[i].shape(), full[i].dtype(), full[i].device());
    const std::vector<std::shared_ptr<void>> now = capture_replayable_states();
    LeafGradCapture capture;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      const std::vector<Tensor> in = block_of(full, r0, n, &input_grad);
      std::vector<Edge> roots;
      std::vector<Tensor> gs;
      {
        restore_replayable_states(rng);
        EnableGradGuard eg;
        SavedTensorHooksGuard keep(keep_in_place_hooks());
        RowTileDrawsScope draws({rows, r0, n});
        const std::vector<Tensor> outs = fn(in);
        LT_CHECK(outs.size() == grads.size(), "tiled_rows: ", outs.size(),
                 " outputs on recompute, ", grads.size(), " the first time");
        for (size_t j = 0; j < outs.size(); ++j) {
          if (!grads[j].defined() || !outs[j].requires_grad()) continue;
          roots.push_back(gradient_edge(outs[j]));
          gs.push_back(grads[j].narrow(0, r0, n));
        }
        if (!roots.empty()) backward_from_edges(roots, std::move(gs));
      }
      for (size_t i = 0; i < n_in; ++i) {
        if (!dinputs[i].defined()) continue;
        const Tensor g = capture.take(in[i].impl());
        Tensor rows_i = dinputs[i].narrow(0, r0, n);
        if (g.defined())
          ops::copy(rows_i, g);
        else
          rows_i.zero_();
      }
    }
    restore_replayable_states(now);
    std::vector<Tensor> result = std::move(dinputs);
    for (size_t e = n_in; e < next_edges_.size(); ++e) {
      const TensorImpl* leaf = static_cast<AccumulateGrad*>(next_edges_[e].fn.get())->leaf();
      result.push_back(capture.take(leaf, leaf->grad_dtype_set ? leaf->grad_dtype : leaf->dtype));
    }
    return result;
  }
  std::string name() const override { return "TiledRowsBackward"; }
  void release_saved() override {
    for (auto& s : inputs) s.reset();
  }
};

}  // namespace

int64_t tiled_chunk_rows(int64_t requested) {
  return std::max<int64_t>(4, (requested + 3) / 4 * 4);
}

std::vector<Tensor> tiled_rows(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               int64_t chunk_rows) {
  LT_CHECK(!inputs.empty() && inputs[0].defined() && inputs[0].dim() >= 1,
           "tiled_rows: needs inputs with rows");
  const int64_t rows = inputs[0].size(0);
  for (const Tensor& t : inputs)
    LT_CHECK(t.defined() && t.dim() >= 1 && t.size(0) == rows, "tiled_rows: input ", t.str(),
             " does not have the ", rows, " rows of the first input");
  const int64_t chunk = tiled_chunk_rows(chunk_rows);
  if (rows <= chunk) return fn(inputs);
  const bool grad = grad_mode_enabled();
  std::vector<bool> input_grad;
  for (const Tensor& t : inputs) input_grad.push_back(t.requires_grad());
  const std::vector<std::shared_ptr<void>> rng = capture_replayable_states();
  std::vector<Tensor> full;
  std::vector<Edge> leaves;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    restore_replayable_states(rng);
    RowTileDrawsScope draws({rows, r0, n});
    std::vector<Tensor> outs;
    if (grad && r0 == 0) {
      // The first block runs with grad, to learn which parameters the region reads.
      const std::vector<Tensor> in = block_of(inputs, r0, n, &input_grad);
      const uint64_t first = SequenceMark().sequence_nr();
      SavedTensorHooksGuard keep(keep_in_place_hooks());
      outs = fn(in);
      leaves = leaf_edges(outs, in, first);
    } else {
      NoGradGuard ng;
      outs = fn(block_of(inputs, r0, n, nullptr));
    }
    if (r0 == 0) {
      for (const Tensor& o : outs) {
        LT_CHECK(o.defined() && o.dim() >= 1, "tiled_rows: an output without rows");
        Shape s = o.shape();
        s[0] = rows;
        full.push_back(Tensor::empty(s, o.dtype(), o.device()));
      }
    }
    LT_CHECK(outs.size() == full.size(), "tiled_rows: blocks return different numbers of outputs");
    for (size_t j = 0; j < outs.size(); ++j) {
      LT_CHECK(outs[j].size(0) == n, "tiled_rows: output ", j, " of a ", n, "-row block has ",
               outs[j].size(0), " rows");
      Tensor dst = full[j].narrow(0, r0, n);
      ops::copy(dst, outs[j]);
    }
  }
  if (!grad) return full;
  std::vector<Edge> edges;
  bool any = !leaves.empty();
  for (const Tensor& t : inputs) {
    edges.push_back(gradient_edge(t));
    any = any || edges.back().valid();
  }
  if (!any) return full;
  auto node = std::make_shared<TiledRowsBackward>();
  node->fn = fn;
  node->chunk = chunk;
  node->rows = rows;
  node->rng = rng;
  node->input_grad = input_grad;
  for (const Tensor& t : inputs) node->inputs.emplace_back(t);
  edges.insert(edges.end(), leaves.begin(), leaves.end());
  node->set_edges(std::move(edges));
  node->set_num_outputs(static_cast<uint32_t>(full.size()));
  for (size_t j = 0; j < full.size(); ++j) {
    full[j].impl()->grad_fn = node;
    full[j].impl()->output_nr = static_cast<uint32_t>(j);
  }
  return full;
}

}  // namespace leantune
