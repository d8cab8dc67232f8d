// cross_entropy over aligned targets, and shift_labels for causal LM targets.
//   logits:[T,V] float, targets:[T] i32|i64 (host for the CPU path; -100 = ignored)
//   -> loss_rows:[T], lse:[T] (f32, f64 for f64 logits), loss = sum(loss_rows) / normalizer.
// Per row (softmax in f32, f64 for f64): lse = m + log(sum exp(z - m)), loss = lse - z[y];
// ignored rows get loss 0 (their lse is still written).
// Backward: dlogits = (exp(z - lse) - onehot(y)) * dloss / normalizer, zero rows where ignored.
// Saved for backward: logits, targets and lse. Targets are validated on the host before any
// work, so an out-of-range target throws without touching the outputs.
#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/cpu_common.h"
#include "kernels/softmax_cpu.h"

namespace leantune::kernels {

namespace {

// sum_j exp(z[j] - m): the vectorised row exp when the row is already in the math type.
template <typename T, typename A>
A row_sum_exp(const T* z, int64_t v, A m) {
  if constexpr (std::is_same_v<T, A>) {
    return softmax_cpu::sum_exp_shift(z, v, m);
  } else {
    // 16-bit rows: the sum in double, as the vectorised path flushes its lanes to one (a float
    // running sum over a 150k vocabulary drops the terms below half its ulp).
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(load(z, j) - m);
    return static_cast<A>(s);
  }
}

// d[j] = exp(z[j] - l) * sc; d may be z (in place).
template <typename T, typename A>
void row_scaled_softmax(const T* z, T* d, int64_t v, A l, A sc) {
  if constexpr (std::is_same_v<T, A>) {
    if (d != z) std::memcpy(d, z, static_cast<size_t>(v) * sizeof(T));
    softmax_cpu::exp_shift_sum(d, v, l);
    for (int64_t j = 0; j < v; ++j) d[j] *= sc;
  } else {
    for (int64_t j = 0; j < v; ++j) store(d, j, std::exp(load(z, j) - l) * sc);
  }
}

void check_inputs(const char* op, const Tensor& logits, const Tensor& targets) {
  LT_CHECK(logits.dim() == 2 && logits.size(1) > 0 && dtype_is_floating(logits.dtype()), op,
           ": logits ", logits.str(), " must be [T, V] float with V > 0");
  LT_CHECK(targets.dim() == 1 && targets.numel() == logits.size(0) &&
               (targets.dtype() == DType::kI32 || targets.dtype() == DType::kI64),
           op, ": targets ", targets.str(), " for logits ", logits.str());
}

// Host targets, each -100 or inside [0, V).
std::vector<int64_t> checked_targets(const Tensor& targets, int64_t v, const char* op) {
  std::vector<int64_t> y = targets.to_i64();
  for (size_t t = 0; t < y.size(); ++t)
    LT_CHECK_INPUT(y[t] == kIgnoreIndex || (y[t] >= 0 && y[t] < v), op, ": target ", y[t],
                   " at position ", t, " is outside the vocabulary [0, ", v,
                   ") and is not the ignore index ", kIgnoreIndex);
  return y;
}

class CrossEntropyBackward final : public Node {
 public:
  SavedTensor logits, targets, lse;
  double normalizer = 1.0;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined() || !needs_input_grad(0)) return {Tensor()};
    const Tensor z = logits.unpack();
    Tensor dz = Tensor::empty(z.shape(), z.dtype(), z.device());
    cross_entropy_bwd(z, targets.unpack(), lse.unpack(), grads[0].item() / normalizer, dz);
    return {dz};
  }
  std::string name() const override { return "CrossEntropyBackward"; }
  void release_saved() override {
    logits.reset();
    targets.reset();
    lse.reset();
  }
};

}  // namespace

void cross_entropy_fwd(const Tensor& logits, const Tensor& targets, const Tensor& loss_rows,
                       const Tensor& lse) {
  ProfileScope prof(OpKind::kLoss, logits.device());
  check_inputs("cross_entropy_fwd", logits, targets);
  const int64_t rows = logits.size(0), v = logits.size(1);
  const DType sd = stat_dtype(logits.dtype());
  LT_CHECK(loss_rows.shape() == (Shape{rows}) && loss_rows.dtype() == sd &&
               lse.shape() == (Shape{rows}) && lse.dtype() == sd && loss_rows.is_contiguous() &&
               lse.is_contiguous(),
           "cross_entropy_fwd: loss_rows ", loss_rows.str(), ", lse ", lse.str(), " for logits ",
           logits.str(), " (want [", rows, "] ", dtype_name(sd), ")");
  if (logits.device().is_cuda()) {
    cross_entropy_fwd_cuda(logits, targets, loss_rows, lse);
    return;
  }
  const std::vector<int64_t> y = checked_targets(targets, v, "cross_entropy");
  const Tensor zc = ops::contiguous_workspace(logits);
  LT_DISPATCH_FLOAT(logits.dtype(), T, {
    using A = acc_t<T>;
    const T* pz = static_cast<const T*>(zc.data_ptr());
    A* pl = static_cast<A*>(loss_rows.data_ptr());
    A* pe = static_cast<A*>(lse.data_ptr());
    parallel_for(rows, cpu::grain_for(v), [&](int64_t r) {
      const T* z = pz + r * v;
      A m = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < v; ++j) m = std::max(m, load(z, j));
      const A l = m + std::log(row_sum_exp(z, v, m));
      pe[r] = l;
      pl[r] = y[r] == kIgnoreIndex ? A(0) : l - load(z, y[r]);
    });
  });
}

void cross_entropy_row_stats(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& entropy, const Tensor& top1) {
  ProfileScope prof(OpKind::kLoss, logits.device());
  check_inputs("cross_entropy_row_stats", logits, targets);
  const int64_t rows = logits.size(0), v = logits.size(1);
  const DType sd = stat_dtype(logits.dtype());
  for (const Tensor* t : {&lse, &entropy, &top1})
    LT_CHECK(t->shape() == (Shape{rows}) && t->dtype() == sd && t->is_contiguous(),
             "cross_entropy_row_stats: ", t->str(), " for logits ", logits.str(), " (want [", rows,
             "] ", dtype_name(sd), ")");
  if (logits.device().is_cuda()) {
    cross_entropy_row_stats_cuda(logits, targets, lse, entropy, top1);
    return;
  }
  const std::vector<int64_t> y = checked_targets(targets, v, "cross_entropy_row_stats");
  const Tensor zc = ops::contiguous_workspace(logits);
  LT_DISPATCH_FLOAT(logits.dtype(), T, {
    using A = acc_t<T>;
    const T* pz = static_cast<const T*>(zc.data_ptr());
    const A* pl = static_cast<const A*>(lse.data_ptr());
    A* pe = static_cast<A*>(entropy.data_ptr());
    A* pt = static_cast<A*>(top1.data_ptr());
    parallel_for(rows, cpu::grain_for(v), [&](int64_t r) {
      const T* z = pz + r * v;
      const A l = pl[r];
      double pz_sum = 0;  // over the whole vocabulary: double, as the log-sum-exp's sum
      int64_t arg = 0;
      A best = load(z, 0);
      for (int64_t j = 0; j < v; ++j) {
        const A zj = load(z, j);
        pz_sum += std::exp(zj - l) * zj;
        if (zj > best) {
          best = zj;
          arg = j;
        }
      }
      pe[r] = l - static_cast<A>(pz_sum);
      pt[r] = y[r] != kIgnoreIndex && arg == y[r] ? A(1) : A(0);
    });
  });
}

void cross_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale,
                       const Tensor& dlogits) {
  ProfileScope prof(OpKind::kLoss, logits.device());
  check_inputs("cross_entropy_bwd", logits, targets);
  const int64_t rows = logits.size(0), v = logits.size(1);
  LT_CHECK(lse.shape() == (Shape{rows}) && lse.dtype() == stat_dtype(logits.dtype()),
           "cross_entropy_bwd: lse ", lse.str(), " for logits ", logits.str());
  LT_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype() &&
               dlogits.is_contiguous(),
           "cross_entropy_bwd: dlogits ", dlogits.str(), " for logits ", logits.str());
  if (logits.device().is_cuda()) {
    cross_entropy_bwd_cuda(logits, targets, lse, scale, dlogits);
    return;
  }
  const std::vector<int64_t> y = checked_targets(targets, v, "cross_entropy_bwd");
  const Tensor zc = ops::contiguous_workspace(logits), ec = ops::contiguous_workspace(lse);
  LT_DISPATCH_FLOAT(logits.dtype(), T, {
    using A = acc_t<T>;
    const T* pz = static_cast<const T*>(zc.data_ptr());
    const A* pe = static_cast<const A*>(ec.data_ptr());
    T* pd = static_cast<T*>(dlogits.data_ptr());
    const A sc = static_cast<A>(scale);
    parallel_for(rows, cpu::grain_for(v), [&](int64_t r) {
      const T* z = pz + r * v;
      T* d = pd + r * v;
      if (y[r] == kIgnoreIndex) {
        for (int64_t j = 0; j < v; ++j) store(d, j, A(0));
        return;
      }
      const A l = pe[r];
      // Read before the row is written: dlogits may be the logits themselves (in place).
      const A zy = load(z, y[r]);
      row_scaled_softmax(z, d, v, l, sc);
      // p_y - 1 formed in the accumulation type before the one rounding.
      store(d, y[r], (softmax_cpu::exp1(zy - l) - A(1)) * sc);
    });
  });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double normalizer) {
  check_inputs("cross_entropy", logits, targets);
  LT_CHECK(normalizer > 0, "cross_entropy: normalizer ", normalizer,
           " must be positive (the number of valid targets in the accumulated batch)");
  const int64_t rows = logits.size(0);
  const DType sd = stat_dtype(logits.dtype());
  Tensor loss_rows = Tensor::empty({rows}, sd, logits.device(), MemTag::kWorkspace);
  Tensor lse = Tensor::empty({rows}, sd, logits.device());
  cross_entropy_fwd(logits.detach(), targets, loss_rows, lse);
  const double total = ops::sum(loss_rows).item() / normalizer;
  Tensor loss = Tensor::full({}, total, sd, logits.device());
  if (node_needed({logits})) {
    auto node = std::make_shared<CrossEntropyBackward>();
    node->set_next_edges({logits});
    node->logits = SavedTensor(logits);
    node->targets = SavedTensor(targets);
    node->lse = SavedTensor(lse);
    node->normalizer = normalizer;
    set_history(loss, node);
  }
  return loss;
}

Tensor shift_labels(const Tensor& labels, const Tensor& cu_seqlens) {
  LT_CHECK(labels.dim() == 1 && (labels.dtype() == DType::kI32 || labels.dtype() == DType::kI64),
           "shift_labels: labels ", labels.str(), " must be [T] i32|i64");
  LT_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1 &&
               (cu_seqlens.dtype() == DType::kI32 || cu_seqlens.dtype() == DType::kI64),
           "shift_labels: cu_seqlens ", cu_seqlens.str(), " must be [B+1] i32|i64");
  LT_CHECK(labels.device().is_cpu() && cu_seqlens.device().is_cpu(), "shift_labels: labels ",
           labels.str(), " and cu_seqlens ", cu_seqlens.str(), " must be host tensors");
  const int64_t n = labels.numel();
  const std::vector<int64_t> lab = labels.to_i64(), cu = cu_seqlens.to_i64();
  LT_CHECK(cu.front() == 0 && cu.back() <= n, "shift_labels: cu_seqlens [", cu.front(), " .. ",
           cu.back(), "] for ", n, " labels");
  std::vector<int64_t> out(static_cast<size_t>(n), kIgnoreIndex);
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    LT_CHECK(cu[b] <= cu[b + 1], "shift_labels: cu_seqlens decreases at ", b, ": ", cu[b], " > ",
             cu[b + 1]);
    // The last position of each sequence predicts nothing: it keeps -100.
    for (int64_t t = cu[b]; t + 1 < cu[b + 1]; ++t) out[t] = lab[t + 1];
  }
  if (labels.dtype() == DType::kI64) return Tensor::from_vector(out, {n});
  std::vector<int32_t> o32(out.begin(), out.end());
  return Tensor::from_vector(o32, {n});
}

}  // namespace leantune::kernels
