// linear_cross_entropy_weight_blocks: the fused LM head + loss that hands the head's gradient
// out one block of vocabulary rows at a time (see linear_cross_entropy.h).
//   hidden:[T,H], weight:[V,H] (one float dtype), targets:[T] i32|i64 (-100 ignored)
//   -> loss [] f32 (f64 for f64) = sum over valid t of (lse_t - z[t, y_t]) / normalizer
// Work dtype D = f32 (f64 for f64 inputs). Built from ops::gemm and the two row passes of
// kernels/vocab_block_softmax.h, so the CPU and CUDA run the same source:
//   pass 1, per token chunk X_c and block W_b: Z = X_c W_b^T; lse_c, zy_c merged block by block;
//   pass 2, per block b: for each chunk, Z = X_c W_b^T, G = softmax(Z) - onehot (in place),
//     dX_c += G W_b / N, dW_b (+)= G^T X_c / N; then sink(v0, dW_b in the weight's dtype).
// The head's blocks are read twice (once per pass) and its gradient never exists whole: peak
// extra memory is the [chunk x block] f32 logits, one block's f32 gradient (+ its 16-bit copy)
// and dX in f32 [T, H]; 16-bit operands of the mixed GEMMs are upcast a block at a time.
#include <algorithm>
#include <limits>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/vocab_block_softmax.h"

namespace leantune::kernels {

namespace {

class WeightBlocksBackward final : public Node {
 public:
  SavedTensor dhidden;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    const double dl = grads[0].item();
    LT_CHECK(dl == 1.0,
             "linear_cross_entropy_weight_blocks: the head's gradient was handed out in "
             "forward for d loss = 1, backward got ",
             dl);
    return {dhidden.unpack()};
  }
  std::string name() const override { return "LinearCrossEntropyWeightBlocksBackward"; }
  void release_saved() override { dhidden.reset(); }
};

// A [rows, cols] contiguous view of the front of a flat buffer.
Tensor front(const Tensor& flat, int64_t rows, int64_t cols) {
  return flat.narrow(0, 0, rows * cols).view({rows, cols});
}

}  // namespace

Tensor linear_cross_entropy_weight_blocks(const Tensor& hidden, const Tensor& weight,
                                          const Tensor& targets, double normalizer,
                                          const WeightGradSink& sink,
                                          const LinearCrossEntropyOptions& opt,
                                          int64_t block_rows) {
  const char* op = "linear_cross_entropy_weight_blocks";
  LT_CHECK(!opt.stats, op, ": row statistics are not supported (linear_cross_entropy gives them)");
  LT_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) &&
               hidden.dtype() == weight.dtype() && dtype_is_floating(hidden.dtype()) &&
               hidden.device() == weight.device() && weight.is_contiguous(),
           op, ": hidden ", hidden.str(), " and weight ", weight.str(),
           " must be [T,H] and contiguous [V,H] of one float dtype on one device");
  LT_CHECK(targets.dim() == 1 && targets.numel() == hidden.size(0), op, ": targets ", targets.str(),
           " for hidden ", hidden.str());
  LT_CHECK(normalizer > 0, op, ": normalizer ", normalizer, " must be positive");
  LT_CHECK(opt.chunk_tokens > 0, op, ": chunk_tokens ", opt.chunk_tokens, " must be positive");
  LT_CHECK_INPUT(opt.softcap == 0, op,
                 ": soft-capped logits (final_logit_softcapping) are not supported with the head "
                 "updated by blocks (optimizer_in_backward); train with --max_grad_norm > 0");
  LT_CHECK(static_cast<bool>(sink), op, ": no sink for the weight's gradient");
  const int64_t t = hidden.size(0), h = hidden.size(1), v = weight.size(0);
  const int64_t vb = std::min(v, block_rows > 0 ? block_rows : weight_grad_block_rows(h));
  const Device dev = hidden.device();
  const DType d = hidden.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  std::vector<int64_t> y = targets.to_i64();
  std::vector<char> valid(y.size(), 0);
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == kIgnoreIndex) continue;
    LT_CHECK_INPUT(y[i] >= 0 && y[i] < v, "linear_cross_entropy: target ", y[i], " at position ", i,
                   " is outside the vocabulary [0, ", v, ") and is not the ignore index ",
                   kIgnoreIndex);
    valid[i] = 1;
  }
  const Tensor tg = Tensor::from_vector(y, {t}).to(dev);
  const Tensor x = hidden.detach().is_contiguous() ? hidden.detach() : hidden.detach().contiguous();
  const Tensor w = weight.detach();
  const int64_t cap = std::max<int64_t>(1, std::min(opt.chunk_tokens, t));
  const double coef = 1.0 / normalizer;

  Tensor lse =
      Tensor::full({t}, -std::numeric_limits<double>::infinity(), d, dev, MemTag::kWorkspace);
  Tensor zy = Tensor::zeros({t}, d, dev, MemTag::kWorkspace);
  Tensor zflat = Tensor::empty({cap * vb}, d, dev, MemTag::kWorkspace);
  // Pass 1: each row's log-sum-exp and target logit, block by block.
  for (int64_t c0 = 0; c0 < t; c0 += cap) {
    const int64_t c = std::min(cap, t - c0);
    const Tensor xc = x.narrow(0, c0, c);
    for (int64_t v0 = 0; v0 < v; v0 += vb) {
      const int64_t nb = std::min(vb, v - v0);
      const Tensor z = front(zflat, c, nb);
      ops::gemm(xc, false, w.narrow(0, v0, nb), true, z);
      vocab_block_lse_update(z, tg.narrow(0, c0, c), v0, lse.narrow(0, c0, c), zy.narrow(0, c0, c));
    }
  }
  double sum = 0;
  {
    const std::vector<double> l = lse.to_f64(), zt = zy.to_f64();
    for (int64_t i = 0; i < t; ++i)
      if (valid[i]) sum += l[i] - zt[i];  // in row order: deterministic
  }
  const bool need_dx = node_needed({hidden});
  // Pass 2: per block, its gradient over every token, then handed out.
  Tensor dx = need_dx ? Tensor::zeros({t, h}, d, dev, MemTag::kWorkspace) : Tensor();
  Tensor dwflat = Tensor::empty({vb * h}, d, dev, MemTag::kWorkspace);
  Tensor gflat =
      weight.dtype() == d ? Tensor() : Tensor::empty({vb * h}, weight.dtype(), dev, MemTag::kGrad);
  for (int64_t v0 = 0; v0 < v; v0 += vb) {
    const int64_t nb = std::min(vb, v - v0);
    const Tensor wb = w.narrow(0, v0, nb);
    const Tensor dw = front(dwflat, nb, h);
    if (t == 0) ops::fill(dw, 0.0);
    for (int64_t c0 = 0; c0 < t; c0 += cap) {
      const int64_t c = std::min(cap, t - c0);
      const Tensor xc = x.narrow(0, c0, c);
      const Tensor z = front(zflat, c, nb);
      ops::gemm(xc, false, wb, true, z);
      vocab_block_softmax_grad(z, tg.narrow(0, c0, c), v0, lse.narrow(0, c0, c), 1.0, z);
      if (need_dx) ops::gemm(z, false, wb, false, dx.narrow(0, c0, c), coef, 1.0);
      ops::gemm(z, true, xc, false, dw, coef, c0 == 0 ? 0.0 : 1.0);
    }
    if (gflat.defined()) {
      const Tensor g = front(gflat, nb, h);
      ops::copy(g, dw);
      sink(v0, g);
    } else {
      sink(v0, dw);
    }
  }
  Tensor loss = Tensor::full({}, sum / normalizer, d, dev);
  if (need_dx) {
    Tensor dh = Tensor::empty({t, h}, hidden.dtype(), dev, MemTag::kActivation);
    ops::copy(dh, dx);
    auto node = std::make_shared<WeightBlocksBackward>();
    node->set_next_edges({hidden});
    node->dhidden = SavedTensor(dh);
    set_history(loss, node);
  }
  return loss;
}

}  // namespace leantune::kernels
