// linear_cross_entropy and linear_token_logprobs: the LM head fused with the loss, chunked over
// the tokens that have a valid target, never holding [T, V] logits.
//   hidden:[T,H], weight:[V,H] (one float dtype), targets:[T] i32|i64 (host for the CPU path,
//   -100 = ignored). Math in f32 (f64 for f64 inputs); call that dtype D.
// One chunk of c <= chunk_tokens valid rows (CPU):
//   X_c = hidden[rows] -> D [c,H];  Z = X_c W^T [c,V] (OpenBLAS);  per row lse, z_y;
//   with gradients: Z <- coef_r * (softmax(Z) - onehot(y)) in place, dX_c = Z W scattered into
//   dhidden[rows], dW_acc += Z^T X_c (beta = 1).
// linear_cross_entropy: coef = 1/normalizer; the gradients are computed during the forward pass
// (Liger's FLCE) and held by the node, whose backward only multiplies them by dloss (no copy when
// dloss == 1). linear_token_logprobs: logp = z_y - lse; its backward recomputes each chunk with
// coef_r = -dlogp_r.
// Scratch (kWorkspace): X_c, Z, dX_c for one chunk (chunk_tokens x (2H + V) values of D), plus,
// for 16-bit weights, one f32 copy of W and an f32 dW accumulator when dweight is 16-bit. None of
// it grows with T. The weight gradient the nodes return is D-typed ([V,H] f32 for 16-bit
// weights, tagged kGrad); dhidden has hidden's dtype (kActivation), zero on ignored rows.
#include "kernels/linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/autograd.h"
#include "engine/cpu_kernels.h"
#include "engine/ops.h"
#include "kernels/cross_entropy.h"
#include "kernels/softmax_cpu.h"

namespace leantune::kernels {

using cpu::acc_t;
using cpu::load;
using cpu::parallel_for;
using cpu::store;

namespace {

DType work_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

// t as a contiguous tensor of dtype dt (no copy when it already is one).
Tensor as(const Tensor& t, DType dt) {
  if (t.dtype() == dt && t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), dt, t.device(), MemTag::kWorkspace);
  ops::copy(c, t);
  return c;
}

void check_inputs(const char* op, const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                  const LinearCrossEntropyOptions& opt) {
  LT_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) &&
               weight.size(0) > 0,
           op, ": hidden ", hidden.str(), ", weight ", weight.str());
  LT_CHECK(hidden.dtype() == weight.dtype() && dtype_is_floating(hidden.dtype()), op, ": hidden ",
           hidden.str(), " and weight ", weight.str(), " need one float dtype");
  LT_CHECK(targets.dim() == 1 && targets.numel() == hidden.size(0) &&
               (targets.dtype() == DType::kI32 || targets.dtype() == DType::kI64),
           op, ": targets ", targets.str(), " for hidden ", hidden.str());
  LT_CHECK(opt.chunk_tokens > 0, op, ": chunk_tokens ", opt.chunk_tokens, " must be positive");
}

// The rows with a valid target and their targets, each checked against [0, V).
void valid_rows(const Tensor& targets, int64_t v, const char* op, std::vector<int64_t>* rows,
                std::vector<int64_t>* tgt) {
  const std::vector<int64_t> y = targets.to_i64();
  for (size_t t = 0; t < y.size(); ++t) {
    if (y[t] == kIgnoreIndex) continue;
    LT_CHECK_INPUT(y[t] >= 0 && y[t] < v, op, ": target ", y[t], " at position ", t,
                   " is outside the vocabulary [0, ", v, ") and is not the ignore index ",
                   kIgnoreIndex);
    rows->push_back(static_cast<int64_t>(t));
    tgt->push_back(y[t]);
  }
}

// The chunk loop shared by the three entry points. w: [V,H] of dtype D (A's dtype), contiguous.
// coef: one gradient coefficient per valid row, or nullptr for no gradients. lse/zy receive one
// value per valid row. dhidden rows listed in `rows` are overwritten; dw_acc ([V,H] D) is added
// to.
template <typename A>
void chunk_loop(const Tensor& hidden, const Tensor& w, const std::vector<int64_t>& rows,
                const std::vector<int64_t>& tgt, const std::vector<A>* coef, const Tensor& dhidden,
                const Tensor& dw_acc, int64_t chunk_tokens, std::vector<A>* lse,
                std::vector<A>* zy) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t h = hidden.size(1), v = w.size(0);
  lse->assign(static_cast<size_t>(n), A(0));
  zy->assign(static_cast<size_t>(n), A(0));
  if (n == 0) return;
  const DType d = DTypeOf<A>::value;
  const int64_t cap = std::min(chunk_tokens, n);
  const bool grads = coef != nullptr && (dhidden.defined() || dw_acc.defined());
  Tensor xbuf = Tensor::empty({cap, h}, d, hidden.device(), MemTag::kWorkspace);
  Tensor zbuf = Tensor::empty({cap, v}, d, hidden.device(), MemTag::kWorkspace);
  Tensor dxbuf;
  if (grads && dhidden.defined())
    dxbuf = Tensor::empty({cap, h}, d, hidden.device(), MemTag::kWorkspace);
  for (int64_t c0 = 0; c0 < n; c0 += cap) {
    const int64_t c = std::min(cap, n - c0);
    Tensor xc = xbuf.narrow(0, 0, c), zc = zbuf.narrow(0, 0, c);
    A* px = static_cast<A*>(xc.data_ptr());
    LT_DISPATCH_FLOAT(hidden.dtype(), T, {
      const T* ph = static_cast<const T*>(hidden.data_ptr());
      parallel_for(c, cpu::grain_for(h), [&](int64_t r) {
        const T* src = ph + rows[c0 + r] * h;
        for (int64_t j = 0; j < h; ++j) px[r * h + j] = static_cast<A>(load(src, j));
      });
    });
    ops::gemm(xc, false, w, true, zc, 1.0, 0.0);
    A* pz = static_cast<A*>(zc.data_ptr());
    parallel_for(c, cpu::grain_for(v), [&](int64_t r) {
      A* z = pz + r * v;
      const int64_t y = tgt[c0 + r];
      const A zt = z[y];
      A m = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < v; ++j) m = std::max(m, z[j]);
      // With gradients, exp(z - m) is kept and normalised once the sum is known: one exp per
      // logit in all.
      const A s = grads ? softmax_cpu::exp_shift_sum(z, v, m) : softmax_cpu::sum_exp_shift(z, v, m);
      const A l = m + std::log(s);
      (*lse)[c0 + r] = l;
      (*zy)[c0 + r] = zt;
      if (!grads) return;
      const A k = (*coef)[c0 + r];
      const A ks = k / s;
      for (int64_t j = 0; j < v; ++j) z[j] *= ks;
      // p_y - 1 is formed before scaling so that it keeps its precision when p_y is near 1.
      z[y] = (softmax_cpu::exp1(zt - l) - A(1)) * k;
    });
    if (!grads) continue;
    if (dhidden.defined()) {
      Tensor dxc = dxbuf.narrow(0, 0, c);
      ops::gemm(zc, false, w, false, dxc, 1.0, 0.0);
      const A* pdx = static_cast<const A*>(dxc.data_ptr());
      LT_DISPATCH_FLOAT(dhidden.dtype(), T, {
        T* pd = static_cast<T*>(dhidden.data_ptr());
        parallel_for(c, cpu::grain_for(h), [&](int64_t r) {
          T* dst = pd + rows[c0 + r] * h;
          for (int64_t j = 0; j < h; ++j) store(dst, j, static_cast<acc_t<T>>(pdx[r * h + j]));
        });
      });
    }
    if (dw_acc.defined()) ops::gemm(zc, true, xc, false, dw_acc, 1.0, 1.0);
  }
}

// Zeroes the rows of dhidden whose target is ignored.
void zero_ignored_rows(const Tensor& dhidden, const std::vector<int64_t>& rows) {
  const int64_t t = dhidden.size(0);
  const size_t row_bytes = static_cast<size_t>(dhidden.size(1)) * dhidden.element_size();
  std::vector<char> valid(static_cast<size_t>(t), 0);
  for (int64_t r : rows) valid[r] = 1;
  char* p = static_cast<char*>(dhidden.data_ptr());
  for (int64_t r = 0; r < t; ++r)
    if (!valid[r]) std::memset(p + r * row_bytes, 0, row_bytes);
}

// Runs the loop in D = work_dtype(hidden): converts W once and, when dweight is not D-typed and
// contiguous, accumulates into a D copy of it that is written back at the end.
template <typename A>
void run(const Tensor& hidden0, const Tensor& weight, const std::vector<int64_t>& rows,
         const std::vector<int64_t>& tgt, const std::vector<A>* coef, const Tensor& dhidden,
         const Tensor& dweight, int64_t chunk_tokens, std::vector<A>* lse, std::vector<A>* zy) {
  const DType d = DTypeOf<A>::value;
  const Tensor hidden = as(hidden0, hidden0.dtype());
  const Tensor w = as(weight, d);
  Tensor dw_acc;
  if (dweight.defined()) dw_acc = as(dweight, d);
  chunk_loop<A>(hidden, w, rows, tgt, coef, dhidden, dw_acc, chunk_tokens, lse, zy);
  if (dweight.defined() && !dw_acc.shares_storage(dweight)) ops::copy(dweight, dw_acc);
  if (dhidden.defined()) zero_ignored_rows(dhidden, rows);
}

class LinearCrossEntropyBackward final : public Node {
 public:
  SavedTensor dhidden, dweight;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const double dl = grads[0].item();
    Tensor dh = needs_input_grad(0) ? dhidden.unpack() : Tensor();
    Tensor dw = needs_input_grad(1) ? dweight.unpack() : Tensor();
    // The held gradients belong to this node; a copy is made only when they need scaling, so
    // a retained graph can run backward again.
    if (dl != 1.0) {
      if (dh.defined()) dh = ops::scale(dh, dl);
      if (dw.defined()) dw = ops::scale(dw, dl);
    }
    return {dh, dw};
  }
  std::string name() const override { return "LinearCrossEntropyBackward"; }
  void release_saved() override {
    dhidden.reset();
    dweight.reset();
  }
};

class LinearTokenLogprobsBackward final : public Node {
 public:
  SavedTensor hidden, weight, targets;
  int64_t chunk_tokens = 1024;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const Tensor x = hidden.unpack(), w = weight.unpack();
    const DType d = work_dtype(x.dtype());
    // d logp / dz = onehot - softmax: the coefficient of (softmax - onehot) is -dlogp.
    const Tensor coef = ops::scale(as(grads[0], d), -1.0);
    Tensor dx, dw;
    if (needs_input_grad(0)) dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (needs_input_grad(1)) dw = Tensor::zeros(w.shape(), d, w.device());
    linear_cross_entropy_rows(x, w, targets.unpack(), coef, Tensor(), dx, dw, {chunk_tokens});
    return {dx, dw};
  }
  std::string name() const override { return "LinearTokenLogprobsBackward"; }
  void release_saved() override {
    hidden.reset();
    weight.reset();
    targets.reset();
  }
};

}  // namespace

double linear_cross_entropy_fwd_bwd(const Tensor& hidden, const Tensor& weight,
                                    const Tensor& targets, double grad_scale, const Tensor& dhidden,
                                    const Tensor& dweight, const LinearCrossEntropyOptions& opt) {
  check_inputs("linear_cross_entropy", hidden, weight, targets, opt);
  if (dhidden.defined())
    LT_CHECK(dhidden.shape() == hidden.shape() && dtype_is_floating(dhidden.dtype()) &&
                 dhidden.is_contiguous(),
             "linear_cross_entropy: dhidden ", dhidden.str(), " for hidden ", hidden.str());
  if (dweight.defined())
    LT_CHECK(dweight.shape() == weight.shape() && dtype_is_floating(dweight.dtype()),
             "linear_cross_entropy: dweight ", dweight.str(), " for weight ", weight.str());
  if (hidden.device().is_cuda()) {
    return linear_cross_entropy_fwd_bwd_cuda(hidden, weight, targets, grad_scale, dhidden, dweight,
                                             opt);
  }
  std::vector<int64_t> rows, tgt;
  valid_rows(targets, weight.size(0), "linear_cross_entropy", &rows, &tgt);
  double loss = 0;
  auto go = [&]<typename A>() {
    std::vector<A> coef(rows.size(), static_cast<A>(grad_scale));
    std::vector<A> lse, zy;
    run<A>(hidden, weight, rows, tgt, &coef, dhidden, dweight, opt.chunk_tokens, &lse, &zy);
    // Summed in row order in double: deterministic whatever the chunking.
    for (size_t i = 0; i < rows.size(); ++i) loss += static_cast<double>(lse[i] - zy[i]);
  };
  if (work_dtype(hidden.dtype()) == DType::kF64)
    go.template operator()<double>();
  else
    go.template operator()<float>();
  return loss;
}

Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                            double normalizer, const LinearCrossEntropyOptions& opt) {
  check_inputs("linear_cross_entropy", hidden, weight, targets, opt);
  LT_CHECK(normalizer > 0, "linear_cross_entropy: normalizer ", normalizer,
           " must be positive (the number of valid targets in the accumulated batch)");
  const DType d = work_dtype(hidden.dtype());
  const bool need = node_needed({hidden, weight});
  Tensor dh, dw;
  if (need && hidden.requires_grad())
    dh = Tensor::empty(hidden.shape(), hidden.dtype(), hidden.device(), MemTag::kActivation);
  if (need && weight.requires_grad())
    dw = Tensor::zeros(weight.shape(), d, weight.device(), MemTag::kGrad);
  const double sum = linear_cross_entropy_fwd_bwd(hidden.detach(), weight.detach(), targets,
                                                  1.0 / normalizer, dh, dw, opt);
  Tensor loss = Tensor::full({}, sum / normalizer, d, hidden.device());
  if (need) {
    auto node = std::make_shared<LinearCrossEntropyBackward>();
    node->set_next_edges({hidden, weight});
    node->dhidden = SavedTensor(dh);
    node->dweight = SavedTensor(dw);
    set_history(loss, node);
  }
  return loss;
}

void linear_cross_entropy_rows(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                               const Tensor& coef, const Tensor& nll, const Tensor& dhidden,
                               const Tensor& dweight, const LinearCrossEntropyOptions& opt) {
  check_inputs("linear_cross_entropy_rows", hidden, weight, targets, opt);
  LT_CHECK(hidden.device().is_cpu(), "linear_cross_entropy_rows: ", hidden.str(),
           " is on a CUDA device; only the CPU path exists for per-row outputs");
  const int64_t t = hidden.size(0);
  const DType d = work_dtype(hidden.dtype());
  const bool grads = dhidden.defined() || dweight.defined();
  if (nll.defined())
    LT_CHECK(nll.shape() == (Shape{t}) && nll.dtype() == d && nll.is_contiguous(),
             "linear_cross_entropy_rows: nll ", nll.str(), " for hidden ", hidden.str(), " (want [",
             t, "] ", dtype_name(d), ")");
  if (grads)
    LT_CHECK(coef.defined() && coef.shape() == (Shape{t}) && dtype_is_floating(coef.dtype()),
             "linear_cross_entropy_rows: coef ", coef.defined() ? coef.str() : "undefined",
             " for hidden ", hidden.str());
  if (dhidden.defined())
    LT_CHECK(dhidden.shape() == hidden.shape() && dtype_is_floating(dhidden.dtype()) &&
                 dhidden.is_contiguous(),
             "linear_cross_entropy_rows: dhidden ", dhidden.str(), " for hidden ", hidden.str());
  if (dweight.defined())
    LT_CHECK(dweight.shape() == weight.shape() && dtype_is_floating(dweight.dtype()),
             "linear_cross_entropy_rows: dweight ", dweight.str(), " for weight ", weight.str());
  std::vector<int64_t> rows, tgt;
  valid_rows(targets, weight.size(0), "linear_cross_entropy", &rows, &tgt);
  auto go = [&]<typename A>() {
    std::vector<A> c;
    if (grads) {
      const std::vector<double> all = coef.to_f64();
      for (int64_t r : rows) c.push_back(static_cast<A>(all[r]));
    }
    std::vector<A> lse, zy;
    run<A>(hidden, weight, rows, tgt, grads ? &c : nullptr, dhidden, dweight, opt.chunk_tokens,
           &lse, &zy);
    if (!nll.defined()) return;
    A* out = static_cast<A*>(nll.data_ptr());
    std::fill(out, out + t, A(0));
    for (size_t i = 0; i < rows.size(); ++i) out[rows[i]] = lse[i] - zy[i];
  };
  if (d == DType::kF64)
    go.template operator()<double>();
  else
    go.template operator()<float>();
}

Tensor linear_token_logprobs(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                             const LinearCrossEntropyOptions& opt) {
  check_inputs("linear_token_logprobs", hidden, weight, targets, opt);
  Tensor nll = Tensor::empty({hidden.size(0)}, work_dtype(hidden.dtype()), hidden.device(),
                             MemTag::kWorkspace);
  linear_cross_entropy_rows(hidden.detach(), weight.detach(), targets, Tensor(), nll, Tensor(),
                            Tensor(), opt);
  Tensor out = ops::scale(nll, -1.0);
  if (node_needed({hidden, weight})) {
    auto node = std::make_shared<LinearTokenLogprobsBackward>();
    node->set_next_edges({hidden, weight});
    node->hidden = SavedTensor(hidden);
    node->weight = SavedTensor(weight);
    node->targets = SavedTensor(targets);
    node->chunk_tokens = opt.chunk_tokens;
    set_history(out, node);
  }
  return out;
}

}  // namespace leantune::kernels
