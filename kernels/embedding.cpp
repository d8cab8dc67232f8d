// embedding: y[t] = weight[ids[t]]
//   weight:[V,H] f32|bf16|f16|f64, ids:[T] i32|i64 (host for the CPU path) -> y:[T,H] contiguous
// Backward: dweight[v] = sum_{t: ids[t]==v} dy[t]. The CPU path groups the token positions by id
// (a counting sort, stable), so every row of dweight is summed by one thread in token order: the
// result is deterministic and independent of the thread count. Sums are f32 (f64 for f64).
// Saved for backward: ids only (plus V). Scratch: the sort's index arrays (host vectors, O(T+V)).
#include "kernels/embedding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cpu_common.h"

namespace leantune::kernels {

namespace {

// Ids as host int64 values, each checked against [0, V).
std::vector<int64_t> checked_ids(const Tensor& ids, int64_t v, const char* op) {
  LT_CHECK(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, op, ": ids ", ids.str(),
           " must be i32 or i64");
  std::vector<int64_t> out = ids.to_i64();
  for (size_t t = 0; t < out.size(); ++t)
    LT_CHECK_INPUT(out[t] >= 0 && out[t] < v, op, ": token id ", out[t], " at position ", t,
                   " is outside the vocabulary [0, ", v, ")");
  return out;
}

class EmbeddingBackward final : public Node {
 public:
  SavedTensor ids;
  Shape weight_shape;
  DType weight_dtype = DType::kF32;
  Device device;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& dy = grads[0];
    if (!dy.defined() || !needs_input_grad(0)) return {Tensor()};
    Tensor dw = Tensor::empty(weight_shape, weight_dtype, device);
    embedding_bwd(dy, ids.unpack(), dw);
    return {dw};
  }
  std::string name() const override { return "EmbeddingBackward"; }
  void release_saved() override { ids.reset(); }
};

class EmbeddingBlocksBackward final : public Node {
 public:
  SavedTensor ids;
  Shape weight_shape;
  DType weight_dtype = DType::kF32;
  Device device;
  WeightGradSink sink;
  int64_t block_rows = 0;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& dy = grads[0];
    if (!dy.defined()) return {Tensor()};
    const int64_t v = weight_shape[0], h = weight_shape[1];
    const std::vector<int64_t> id = checked_ids(ids.unpack(), v, "embedding_bwd");
    const int64_t vb = std::min(v, block_rows > 0 ? block_rows : weight_grad_block_rows(h));
    // Positions grouped by block, each group in token order.
    std::vector<std::vector<int64_t>> pos(static_cast<size_t>((v + vb - 1) / vb));
    for (size_t t = 0; t < id.size(); ++t) pos[id[t] / vb].push_back(static_cast<int64_t>(t));
    Tensor flat = Tensor::empty({vb * h}, weight_dtype, device, MemTag::kGrad);
    for (int64_t r0 = 0, b = 0; r0 < v; r0 += vb, ++b) {
      const int64_t nb = std::min(vb, v - r0);
      const Tensor dw = flat.narrow(0, 0, nb * h).view({nb, h});
      const std::vector<int64_t>& p = pos[b];
      if (p.empty()) {
        ops::fill(dw, 0.0);
      } else {
        std::vector<int64_t> local(p.size());
        for (size_t k = 0; k < p.size(); ++k) local[k] = id[p[k]] - r0;
        const Shape n{static_cast<int64_t>(p.size())};
        const Tensor rows = ops::index_rows(dy, Tensor::from_vector(p, n).to(dy.device()));
        embedding_bwd(rows, Tensor::from_vector(local, n).to(device), dw);
      }
      sink(r0, dw);
    }
    return {Tensor()};
  }
  std::string name() const override { return "EmbeddingBlocksBackward"; }
  void release_saved() override { ids.reset(); }
};

}  // namespace

void embedding_fwd(const Tensor& weight, const Tensor& ids, const Tensor& y) {
  LT_CHECK(weight.dim() == 2 && ids.dim() == 1, "embedding: weight ", weight.str(), ", ids ",
           ids.str());
  const int64_t v = weight.size(0), h = weight.size(1), n = ids.numel();
  LT_CHECK(y.shape() == (Shape{n, h}) && y.dtype() == weight.dtype() && y.is_contiguous(),
           "embedding: y ", y.str(), " for weight ", weight.str(), " and ids ", ids.str());
  if (weight.device().is_cuda()) {
    embedding_fwd_cuda(weight, ids, y);
    return;
  }
  const std::vector<int64_t> id = checked_ids(ids, v, "embedding");
  const Tensor w = ops::contiguous_workspace(weight);
  const size_t row = static_cast<size_t>(h) * w.element_size();
  const char* src = static_cast<const char*>(w.data_ptr());
  char* dst = static_cast<char*>(y.data_ptr());
  parallel_for(n, cpu::grain_for(h),
               [&](int64_t t) { std::memcpy(dst + t * row, src + id[t] * row, row); });
}

void embedding_bwd(const Tensor& dy, const Tensor& ids, const Tensor& dweight) {
  LT_CHECK(dweight.dim() == 2 && ids.dim() == 1, "embedding_bwd: dweight ", dweight.str(), ", ids ",
           ids.str());
  const int64_t v = dweight.size(0), h = dweight.size(1), n = ids.numel();
  LT_CHECK(dy.shape() == (Shape{n, h}), "embedding_bwd: dy ", dy.str(), " for ids ", ids.str(),
           " and dweight ", dweight.str());
  LT_CHECK(dweight.is_contiguous(), "embedding_bwd: dweight ", dweight.str(),
           " must be contiguous");
  if (dweight.device().is_cuda()) {
    embedding_bwd_cuda(dy, ids, dweight);
    return;
  }
  const std::vector<int64_t> id = checked_ids(ids, v, "embedding_bwd");
  // Counting sort of the positions by id: start[v]..start[v+1] lists the positions of id v.
  std::vector<int64_t> start(static_cast<size_t>(v) + 1, 0), order(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ++start[id[t] + 1];
  for (int64_t i = 0; i < v; ++i) start[i + 1] += start[i];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < n; ++t) order[fill[id[t]]++] = t;
  }
  const Tensor g =
      dy.dtype() == dweight.dtype() ? ops::contiguous_workspace(dy) : dy.to(dweight.dtype());
  LT_DISPATCH_FLOAT(dweight.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = static_cast<const T*>(g.data_ptr());
    T* pw = static_cast<T*>(dweight.data_ptr());
    parallel_for(v, cpu::grain_for(h), [&](int64_t r) {
      T* out = pw + r * h;
      const int64_t b = start[r], e = start[r + 1];
      if (b == e) {
        for (int64_t j = 0; j < h; ++j) store(out, j, A(0));
        return;
      }
      std::vector<A> acc(static_cast<size_t>(h), A(0));
      for (int64_t k = b; k < e; ++k) {
        const T* src = pg + order[k] * h;
        for (int64_t j = 0; j < h; ++j) acc[j] += load(src, j);
      }
      for (int64_t j = 0; j < h; ++j) store(out, j, acc[j]);
    });
  });
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  LT_CHECK(weight.dim() == 2 && ids.dim() == 1, "embedding: weight ", weight.str(), ", ids ",
           ids.str());
  Tensor y = Tensor::empty({ids.numel(), weight.size(1)}, weight.dtype(), weight.device());
  embedding_fwd(weight.detach(), ids, y);
  if (node_needed({weight})) {
    auto node = std::make_shared<EmbeddingBackward>();
    node->set_next_edges({weight});
    node->ids = SavedTensor(ids);
    node->weight_shape = weight.shape();
    node->weight_dtype = weight.dtype();
    node->device = weight.device();
    set_history(y, node);
  }
  return y;
}

Tensor embedding_weight_blocks(const Tensor& weight, const Tensor& ids, const WeightGradSink& sink,
                               int64_t block_rows) {
  LT_CHECK(weight.dim() == 2 && ids.dim() == 1, "embedding: weight ", weight.str(), ", ids ",
           ids.str());
  LT_CHECK(static_cast<bool>(sink), "embedding_weight_blocks: no sink for the weight's gradient");
  Tensor y = Tensor::empty({ids.numel(), weight.size(1)}, weight.dtype(), weight.device());
  embedding_fwd(weight.detach(), ids, y);
  if (node_needed({weight})) {
    auto node = std::make_shared<EmbeddingBlocksBackward>();
    // The weight's edge is kept (the node needs one) but gets no gradient: the sink has it.
    node->set_next_edges({weight});
    node->ids = SavedTensor(ids);
    node->weight_shape = weight.shape();
    node->weight_dtype = weight.dtype();
    node->device = weight.device();
    node->sink = sink;
    node->block_rows = block_rows;
    set_history(y, node);
  }
  return y;
}

}  // namespace leantune::kernels
