// linear_cross_entropy and linear_token_logprobs: the LM head fused with the loss, chunked over
// the tokens that have a valid target, never holding [T, V] logits.
//   hidden:[T,H], weight:[V,H] (one float dtype), targets:[T] i32|i64 (host for the CPU path,
//   -100 = ignored). Math in f32 (f64 for f64 inputs); call that dtype D.
// One chunk of c <= chunk_tokens valid rows (CPU):
//   X_c = hidden[rows] -> D [c,H];  Z = X_c W^T [c,V] (OpenBLAS);  per row lse, z_y;
//   with gradients: Z <- coef_r * (softmax(Z) - onehot(y)) in place, dX_c = Z W scattered into
//   dhidden[rows], dW_acc += Z^T X_c (beta = 1).
// Soft-capping (opt.softcap = c > 0, Gemma's final_logit_softcapping): Z <- c tanh(Z / c) right
// after the GEMM, and the gradient rows are multiplied by 1 - (Z/c)^2, Z/c recovered from the
// kept exp(Z - m) as (m + log e) / c (exact where the factor matters: a row's softmax value that
// underflows to 0 has a zero gradient whatever the factor).
// linear_cross_entropy: coef = 1/normalizer; the gradients are computed during the forward pass
// (Liger's FLCE) and held by the node, whose backward only multiplies them by dloss (no copy when
// dloss == 1). linear_token_logprobs: logp = z_y - lse; its backward recomputes each chunk with
// coef_r = -dlogp_r.
// 16-bit weights are never copied whole to f32: the GEMMs run over blocks of rows of W
// (weight_block_rows: about 16 MiB of f32 each), converted as they are used (twice per chunk: for
// Z, then for dX_c); dW[block] += G[:, block]^T X_c goes through an f32 block buffer when dW is
// not D-typed, so a 16-bit dW is rounded once per chunk of tokens (Liger's FLCE accumulates in the
// weight's dtype the same way). f32/f64 weights take one GEMM per product, as one block.
// Scratch (kWorkspace): X_c, Z, dX_c for one chunk (chunk_tokens x (2H + V) values of D), plus,
// for 16-bit weights, the f32 block of W and (16-bit dW) the f32 block of dW. None of it grows
// with T. linear_cross_entropy's weight gradient has the weight's dtype (kGrad);
// linear_token_logprobs' is D-typed; dhidden has hidden's dtype (kActivation), zero on ignored
// rows.
#include "kernels/linear_cross_entropy.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/cpu_common.h"
#include "kernels/cross_entropy.h"
#include "kernels/softmax_cpu.h"

namespace leantune::kernels {

void linear_cross_entropy_check_operands(const char* op, const Tensor& hidden, const Tensor& weight,
                                         const Tensor& targets) {
  LT_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) &&
               weight.size(0) > 0,
           op, ": hidden ", hidden.str(), ", weight ", weight.str());
  LT_CHECK(hidden.dtype() == weight.dtype() && dtype_is_floating(hidden.dtype()), op, ": hidden ",
           hidden.str(), " and weight ", weight.str(), " need one float dtype");
  LT_CHECK(targets.dim() == 1 && targets.numel() == hidden.size(0) &&
               (targets.dtype() == DType::kI32 || targets.dtype() == DType::kI64),
           op, ": targets ", targets.str(), " for hidden ", hidden.str());
}

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
  linear_cross_entropy_check_operands(op, hidden, weight, targets);
  LT_CHECK(opt.chunk_tokens > 0, op, ": chunk_tokens ", opt.chunk_tokens, " must be positive");
  LT_CHECK(opt.softcap >= 0, op, ": softcap ", opt.softcap, " must be >= 0");
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

// Rows of the head converted to the work dtype at a time when the weight is 16-bit: the f32
// block buffer stays near 16 MiB instead of an f32 copy of the whole head.
int64_t weight_block_rows(int64_t v, int64_t h) {
  return std::clamp<int64_t>((int64_t{4} << 20) / std::max<int64_t>(h, 1), 1, v);
}

// Row-major C[m,n] (ld ldc) = alpha op(A) op(B) + beta C, all of dtype A (OpenBLAS).
template <typename A>
void gemm_ld(bool ta, bool tb, int64_t m, int64_t n, int64_t k, A alpha, const A* a, int64_t lda,
             const A* b, int64_t ldb, A beta, A* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<A, double>)
    cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// dst[i] = A(src[i]) for the n elements of a contiguous block of any float dtype.
template <typename A>
void to_work(const Tensor& src, A* dst) {
  const int64_t n = src.numel();
  LT_DISPATCH_FLOAT(src.dtype(), T, {
    const T* ps = static_cast<const T*>(src.data_ptr());
    parallel_for(n, cpu::grain_for(1), [&](int64_t i) { dst[i] = static_cast<A>(load(ps, i)); });
  });
}

// The head in blocks of rows, each as a contiguous A-typed [rows, H] array: a view of the weight
// when it is A-typed (then one block holds every row), else converted into a reused buffer.
template <typename A>
class WeightBlocks {
 public:
  explicit WeightBlocks(const Tensor& w) : w_(w) {
    const int64_t v = w.size(0), h = w.size(1);
    direct_ = w.dtype() == DTypeOf<A>::value;
    rows_ = direct_ ? v : weight_block_rows(v, h);
    if (!direct_)
      buf_ = Tensor::empty({rows_, h}, DTypeOf<A>::value, w.device(), MemTag::kWorkspace);
  }
  int64_t rows() const { return rows_; }
  // Rows [r0, r0 + n) as A values.
  const A* get(int64_t r0, int64_t n) {
    if (direct_) return static_cast<const A*>(w_.data_ptr()) + r0 * w_.size(1);
    A* out = static_cast<A*>(buf_.data_ptr());
    to_work<A>(w_.narrow(0, r0, n), out);
    return out;
  }

 private:
  Tensor w_, buf_;
  bool direct_ = true;
  int64_t rows_ = 0;
};

// The chunk loop shared by the three entry points. w: [V,H] contiguous, of dtype D (A's dtype)
// or 16-bit (converted block by block, WeightBlocks). coef: one gradient coefficient per valid
// row, or nullptr for no gradients. lse/zy receive one value per valid row. dhidden rows listed
// in `rows` are overwritten; dweight ([V,H] contiguous, any float dtype) is added to: in place
// when D-typed, else per block of rows through an A-typed buffer, rounded once per chunk.
template <typename A>
void chunk_loop(const Tensor& hidden, const Tensor& w, const std::vector<int64_t>& rows,
                const std::vector<int64_t>& tgt, const std::vector<A>* coef, const Tensor& dhidden,
                const Tensor& dweight, int64_t chunk_tokens, A softcap, std::vector<A>* lse,
                std::vector<A>* zy, LinearCrossEntropyStats* stats = nullptr) {
  const int64_t n = static_cast<int64_t>(rows.size());
  // Per valid row, when asked: the entropy of softmax(z) and whether the target is its top-1.
  std::vector<A> ent(stats ? static_cast<size_t>(n) : 0);
  std::vector<uint8_t> top(stats ? static_cast<size_t>(n) : 0);
  const int64_t h = hidden.size(1), v = w.size(0);
  lse->assign(static_cast<size_t>(n), A(0));
  zy->assign(static_cast<size_t>(n), A(0));
  if (n == 0) return;
  const DType d = DTypeOf<A>::value;
  const int64_t cap = std::min(chunk_tokens, n);
  const bool grads = coef != nullptr && (dhidden.defined() || dweight.defined());
  WeightBlocks<A> wb(w);
  const int64_t vb = wb.rows();
  Tensor xbuf = Tensor::empty({cap, h}, d, hidden.device(), MemTag::kWorkspace);
  Tensor zbuf = Tensor::empty({cap, v}, d, hidden.device(), MemTag::kWorkspace);
  Tensor dxbuf, dwbuf;
  if (grads && dhidden.defined())
    dxbuf = Tensor::empty({cap, h}, d, hidden.device(), MemTag::kWorkspace);
  const bool dw_direct = dweight.defined() && dweight.dtype() == d;
  if (grads && dweight.defined() && !dw_direct)
    dwbuf = Tensor::empty({vb, h}, d, hidden.device(), MemTag::kWorkspace);
  for (int64_t c0 = 0; c0 < n; c0 += cap) {
    const int64_t c = std::min(cap, n - c0);
    A* px = static_cast<A*>(xbuf.data_ptr());
    LT_DISPATCH_FLOAT(hidden.dtype(), T, {
      const T* ph = static_cast<const T*>(hidden.data_ptr());
      parallel_for(c, cpu::grain_for(h), [&](int64_t r) {
        const T* src = ph + rows[c0 + r] * h;
        for (int64_t j = 0; j < h; ++j) px[r * h + j] = static_cast<A>(load(src, j));
      });
    });
    A* pz = static_cast<A*>(zbuf.data_ptr());
    for (int64_t r0 = 0; r0 < v; r0 += vb) {
      const int64_t nb = std::min(vb, v - r0);
      gemm_ld<A>(false, true, c, nb, h, A(1), px, h, wb.get(r0, nb), h, A(0), pz + r0, v);
    }
    parallel_for(c, cpu::grain_for(v), [&](int64_t r) {
      A* z = pz + r * v;
      if (softcap > 0)
        for (int64_t j = 0; j < v; ++j) z[j] = softcap * std::tanh(z[j] / softcap);
      const int64_t y = tgt[c0 + r];
      const A zt = z[y];
      A m = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < v; ++j) m = std::max(m, z[j]);
      if (stats) {
        // A pass of its own, so that the loss and its gradient stay bit for bit as without it.
        A se = 0, sez = 0;
        int64_t arg = 0;
        for (int64_t j = 0; j < v; ++j) {
          const A e = std::exp(z[j] - m);
          se += e;
          sez += e * z[j];
          if (z[j] > z[arg]) arg = j;
        }
        ent[c0 + r] = m + std::log(se) - sez / se;
        top[c0 + r] = arg == y ? 1 : 0;
      }
      // With gradients, exp(z - m) is kept and normalised once the sum is known: one exp per
      // logit in all.
      const A s = grads ? softmax_cpu::exp_shift_sum(z, v, m) : softmax_cpu::sum_exp_shift(z, v, m);
      const A l = m + std::log(s);
      (*lse)[c0 + r] = l;
      (*zy)[c0 + r] = zt;
      if (!grads) return;
      const A k = (*coef)[c0 + r];
      const A ks = k / s;
      if (softcap > 0) {
        // The capped logit from the kept exp(z - m), for the tanh' factor.
        for (int64_t j = 0; j < v; ++j) {
          if (j == y) continue;
          const A t = z[j] > A(0) ? (m + std::log(z[j])) / softcap : A(0);
          z[j] *= ks * (A(1) - t * t);
        }
        const A ty = zt / softcap;
        z[y] = (softmax_cpu::exp1(zt - l) - A(1)) * k * (A(1) - ty * ty);
        return;
      }
      for (int64_t j = 0; j < v; ++j) z[j] *= ks;
      // p_y - 1 is formed before scaling so that it keeps its precision when p_y is near 1.
      z[y] = (softmax_cpu::exp1(zt - l) - A(1)) * k;
    });
    if (!grads) continue;
    A* pdx = dhidden.defined() ? static_cast<A*>(dxbuf.data_ptr()) : nullptr;
    for (int64_t r0 = 0; r0 < v; r0 += vb) {
      const int64_t nb = std::min(vb, v - r0);
      // dX_c (+)= G[:, block] W[block];  dW[block] += G[:, block]^T X_c.
      if (pdx)
        gemm_ld<A>(false, false, c, h, nb, A(1), pz + r0, v, wb.get(r0, nb), h,
                   r0 == 0 ? A(0) : A(1), pdx, h);
      if (!dweight.defined()) continue;
      if (dw_direct) {
        gemm_ld<A>(true, false, nb, h, c, A(1), pz + r0, v, px, h, A(1),
                   static_cast<A*>(dweight.data_ptr()) + r0 * h, h);
      } else {
        const Tensor dst = dweight.narrow(0, r0, nb);
        A* pw = static_cast<A*>(dwbuf.data_ptr());
        to_work<A>(dst, pw);
        gemm_ld<A>(true, false, nb, h, c, A(1), pz + r0, v, px, h, A(1), pw, h);
        ops::copy(dst, dwbuf.narrow(0, 0, nb));
      }
    }
    if (pdx) {
      LT_DISPATCH_FLOAT(dhidden.dtype(), T, {
        T* pd = static_cast<T*>(dhidden.data_ptr());
        parallel_for(c, cpu::grain_for(h), [&](int64_t r) {
          T* dst = pd + rows[c0 + r] * h;
          for (int64_t j = 0; j < h; ++j) store(dst, j, static_cast<acc_t<T>>(pdx[r * h + j]));
        });
      });
    }
  }
  if (!stats) return;
  // Summed in row order in double: deterministic whatever the chunking.
  for (int64_t i = 0; i < n; ++i) {
    stats->entropy_sum += static_cast<double>(ent[i]);
    stats->top1 += top[i];
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

// Runs the loop in D = work_dtype(hidden). The weight is read in place when D-typed, else
// converted block by block; dweight is accumulated into in place (a contiguous copy written back
// only when it is a strided view).
template <typename A>
void run(const Tensor& hidden0, const Tensor& weight, const std::vector<int64_t>& rows,
         const std::vector<int64_t>& tgt, const std::vector<A>* coef, const Tensor& dhidden,
         const Tensor& dweight, int64_t chunk_tokens, double softcap, std::vector<A>* lse,
         std::vector<A>* zy, LinearCrossEntropyStats* stats = nullptr) {
  const Tensor hidden = as(hidden0, hidden0.dtype());
  const DType d = DTypeOf<A>::value;
  const bool narrow_w = weight.dtype() == DType::kBF16 || weight.dtype() == DType::kF16;
  const Tensor w = as(weight, narrow_w ? weight.dtype() : d);
  Tensor dw_acc;
  if (dweight.defined()) dw_acc = as(dweight, dweight.dtype());
  chunk_loop<A>(hidden, w, rows, tgt, coef, dhidden, dw_acc, chunk_tokens, static_cast<A>(softcap),
                lse, zy, stats);
  if (dweight.defined() && !dw_acc.shares_storage(dweight)) ops::copy(dweight, dw_acc);
  if (dhidden.defined()) zero_ignored_rows(dhidden, rows);
}

class LinearCrossEntropyBackward final : public Node {
 public:
  SavedTensor dhidden, dweight;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    ProfileScope prof(OpKind::kLoss, grads[0].device());
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
  LinearCrossEntropyOptions opt;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const Tensor x = hidden.unpack(), w = weight.unpack();
    const DType d = work_dtype(x.dtype());
    // d logp / dz = onehot - softmax: the coefficient of (softmax - onehot) is -dlogp.
    const Tensor coef = ops::scale(as(grads[0], d), -1.0);
    Tensor dx, dw;
    if (needs_input_grad(0)) dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (needs_input_grad(1)) dw = Tensor::zeros(w.shape(), d, w.device());
    linear_cross_entropy_rows(x, w, targets.unpack(), coef, Tensor(), dx, dw, opt);
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
  ProfileScope prof(OpKind::kLoss, hidden.device());
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
    run<A>(hidden, weight, rows, tgt, &coef, dhidden, dweight, opt.chunk_tokens, opt.softcap, &lse,
           &zy, opt.stats);
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
  ProfileScope prof(OpKind::kLoss, hidden.device());
  check_inputs("linear_cross_entropy", hidden, weight, targets, opt);
  LT_CHECK(normalizer > 0, "linear_cross_entropy: normalizer ", normalizer,
           " must be positive (the number of valid targets in the accumulated batch)");
  const DType d = work_dtype(hidden.dtype());
  const bool need = node_needed({hidden, weight});
  Tensor dh, dw;
  if (need && hidden.requires_grad())
    dh = Tensor::empty(hidden.shape(), hidden.dtype(), hidden.device(), MemTag::kActivation);
  // The head's gradient is held in the weight's own dtype (what AccumulateGrad keeps, so it is
  // taken without a copy); 16-bit ones are rounded once per chunk of tokens.
  if (need && weight.requires_grad())
    dw = Tensor::zeros(weight.shape(), weight.dtype(), weight.device(), MemTag::kGrad);
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
  ProfileScope prof(OpKind::kLoss, hidden.device());
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
           opt.softcap, &lse, &zy);
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
    node->opt = opt;
    set_history(out, node);
  }
  return out;
}

}  // namespace leantune::kernels
