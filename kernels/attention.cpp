// attention: causal, grouped-query, variable-length scaled dot-product attention (CPU path and
// autograd node; the CUDA path is attention_*_cuda).
//   q:[Tq,Hq,D], k/v:[Tk,Hk,D], one float dtype; rows may be strided (stride(0) free, heads and
//   head_dim dense), other layouts are copied. cu_seqlens_q/k:[B+1] i32|i64 (read to the host).
//   -> out:[Tq,Hq,D] contiguous (q's dtype), lse:[Hq,Tq] f32 (f64 for f64 inputs).
// Query i of a sequence with Lq queries and Lk keys sees keys j <= i + Lk - Lq (causal,
// bottom-right aligned), and with a sliding window only j > i + Lk - Lq - window; a row that sees
// nothing gets out = 0, lse = -inf, and zero gradients. Soft-capping maps each scaled score s to
// softcap * tanh(s / softcap).
// Rows of q/k beyond cu[B] belong to no sequence and are treated the same way.
//
// CPU algorithm. Work is split per (sequence, head) and parallelised with OpenMP (dynamic
// schedule: sequences differ in length). K and V of the sequence's KV head are gathered once
// into f32 (f64) scratch; queries are processed in blocks of kBlockQ rows, so the largest score
// matrix is kBlockQ x Lk for one sequence, never [T, T] over the flat batch. Per block:
//   S = scale * Q K[kmin:kmax]^T (OpenBLAS; kmin > 0 only with a sliding window: the first key
//   the block's first query sees), soft-capped, masked softmax -> P = exp(S - lse), O = P V.
// Backward tasks are (sequence, KV head): a task loops over the query heads of its group and
// accumulates dK, dV for the group in scratch, so GQA sums need no atomics. Per block, with P
// recomputed from the saved lse and Di = rowsum(dO * O):
//   dV += P^T dO;  dS = P * (dO V^T - Di) (times 1 - tanh^2 when soft-capped);
//   dQ = scale * dS K;  dK += scale * dS^T Q.
// Scratch (kWorkspace): one slab per OpenMP thread, sized by the longest sequence:
//   forward  (2 Lk + 2 kBlockQ) D + kBlockQ Lk values,
//   backward (4 Lk + 3 kBlockQ) D + 2 kBlockQ Lk + 2 kBlockQ values (+ kBlockQ Lk soft-capped).
// Saved for backward: q, k, v, out, lse and both cu_seqlens.
#include "kernels/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <tuple>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/attention_dims.h"
#include "kernels/cpu_common.h"
#include "kernels/softmax_cpu.h"

namespace leantune::kernels {

namespace {

constexpr int64_t kBlockQ = 64;

// Row-major C = alpha op(A) op(B) + beta C on raw buffers.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Sequence boundaries, validated.
struct Seqs {
  std::vector<int64_t> q, k;
  int64_t batch = 0;
  int64_t max_q = 0, max_k = 0;
};

Seqs read_seqs(const Tensor& cu_q, const Tensor& cu_k, int64_t tq, int64_t tk, int64_t total_hint) {
  LT_CHECK(cu_q.dim() == 1 && cu_k.dim() == 1 && cu_q.numel() == cu_k.numel() && cu_q.numel() >= 1,
           "attention: cu_seqlens_q ", cu_q.str(), " and cu_seqlens_k ", cu_k.str(),
           " must both be [B+1]");
  Seqs s;
  s.q = cu_q.to_i64();
  s.k = cu_k.to_i64();
  s.batch = cu_q.numel() - 1;
  std::tie(s.max_q, s.max_k) = check_cu_seqlens("attention", s.q, s.k, tq, tk, total_hint);
  return s;
}

// A [T,H,D] tensor whose heads and head_dim are dense (any row stride); copies otherwise.
Tensor rows_dense(const Tensor& t) {
  const Shape& st = t.strides();
  if (t.size(0) <= 1 ? t.is_contiguous()
                     : (st[2] == 1 || t.size(2) <= 1) && (st[1] == t.size(2) || t.size(1) <= 1) &&
                           st[0] >= t.size(1) * t.size(2))
    return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  ops::copy(c, t);
  return c;
}

int64_t row_stride(const Tensor& t) {
  return t.size(0) <= 1 ? t.size(1) * t.size(2) : t.strides()[0];
}

// A [T,H,D] input as the gathers read it: its data and row stride.
template <typename T>
struct HeadRows {
  const T* p;
  int64_t stride;
};
template <typename T>
HeadRows<T> head_rows(const Tensor& t) {
  return {static_cast<const T*>(t.data_ptr()), row_stride(t)};
}

// Copies rows [r0, r0+n) of head h of the sequence that starts at row `start` of x into dst
// [n, D] (accumulation type).
template <typename T, typename A>
void gather(const HeadRows<T>& x, int64_t start, int64_t h, int64_t d, int64_t r0, int64_t n,
            A* dst) {
  const T* base = x.p + start * x.stride;
  const int64_t stride = x.stride;
  for (int64_t r = 0; r < n; ++r) {
    const T* src = base + (r0 + r) * stride + h * d;
    for (int64_t j = 0; j < d; ++j) dst[r * d + j] = static_cast<A>(load(src, j));
  }
}
template <typename T, typename A>
void scatter(const A* src, int64_t n, int64_t d, T* base, int64_t stride, int64_t h, int64_t r0) {
  for (int64_t r = 0; r < n; ++r) {
    T* dst = base + (r0 + r) * stride + h * d;
    for (int64_t j = 0; j < d; ++j) store(dst, j, static_cast<acc_t<T>>(src[r * d + j]));
  }
}

// Number of keys query i (of lq) sees out of lk: the end of its range.
inline int64_t visible(bool causal, int64_t i, int64_t lq, int64_t lk) {
  return causal ? std::clamp<int64_t>(i + lk - lq + 1, 0, lk) : lk;
}
// The first key query i sees (0 without a sliding window).
inline int64_t first_visible(bool causal, int64_t window, int64_t i, int64_t lq, int64_t lk) {
  return causal && window > 0 ? std::max<int64_t>(0, visible(causal, i, lq, lk) - window) : 0;
}

// The attention's masking and score map, as the kernels apply them.
struct Mask {
  bool causal;
  int64_t window;
  double softcap;
};

// s -> softcap * tanh(s / softcap) over n scores.
template <typename A>
void softcap_row(A* row, int64_t n, A cap) {
  for (int64_t j = 0; j < n; ++j) row[j] = cap * std::tanh(row[j] / cap);
}

// Below this many multiply-adds a call runs on one thread: a parallel region costs more than it
// saves (and much more when the cores are shared).
constexpr double kParallelMinWork = 1 << 20;

// Threads for `tasks` tasks totalling `work` multiply-adds (1 when nested or small).
int worker_threads(int64_t tasks, double work) {
  if (omp_in_parallel() || tasks < 2 || work < kParallelMinWork) return 1;
  return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), tasks));
}

// Runs f(task, thread) for task in [0, n) on `threads` OpenMP threads. OpenBLAS is the OpenMP
// build (see CMakeLists.txt): a GEMM called inside this region runs on its calling thread.
template <typename F>
void for_tasks(int64_t n, int threads, F&& f) {
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i, 0);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) f(i, omp_get_thread_num());
}

// Multiply-adds of one pass over all (sequence, query head) score blocks.
double score_work(const Seqs& s, const AttentionDims& dm) {
  double w = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    w += static_cast<double>(s.q[b + 1] - s.q[b]) * static_cast<double>(s.k[b + 1] - s.k[b]);
  return w * static_cast<double>(dm.hq * dm.d);
}

template <typename T>
void forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Seqs& s,
                  const AttentionDims& dm, double scale_d, const Mask& mk, const Tensor& out,
                  const Tensor& lse) {
  const bool causal = mk.causal;
  const int64_t window = mk.window;
  using A = acc_t<T>;
  const int64_t d = dm.d, lk_max = s.max_k, bq = std::min(kBlockQ, std::max<int64_t>(s.max_q, 1));
  const int64_t slab = 2 * lk_max * d + 2 * bq * d + bq * lk_max;
  const int threads = worker_threads(s.batch * dm.hq, 2 * score_work(s, dm));
  Tensor ws =
      Tensor::empty({threads * slab}, stat_dtype(q.dtype()), q.device(), MemTag::kWorkspace);
  A* wsp = static_cast<A*>(ws.data_ptr());
  const HeadRows<T> rq = head_rows<T>(q), rk = head_rows<T>(k), rv = head_rows<T>(v);
  T* po = static_cast<T*>(out.data_ptr());
  A* pl = static_cast<A*>(lse.data_ptr());
  const int64_t so = dm.hq * d;
  const A scale = static_cast<A>(scale_d);
  const A cap = static_cast<A>(mk.softcap);
  const A neg_inf = -std::numeric_limits<A>::infinity();

  for_tasks(s.batch * dm.hq, threads, [&](int64_t task, int thread) {
    const int64_t b = task / dm.hq, h = task % dm.hq, hk = h / dm.group;
    const int64_t q0 = s.q[b], lq = s.q[b + 1] - q0, k0 = s.k[b], lk = s.k[b + 1] - k0;
    if (lq == 0) return;
    A* kb = wsp + thread * slab;
    A* vb = kb + lk_max * d;
    A* qb = vb + lk_max * d;
    A* ob = qb + bq * d;
    A* sb = ob + bq * d;
    gather(rk, k0, hk, d, 0, lk, kb);
    gather(rv, k0, hk, d, 0, lk, vb);
    for (int64_t i0 = 0; i0 < lq; i0 += bq) {
      const int64_t nb = std::min(bq, lq - i0);
      const int64_t kmax = visible(causal, i0 + nb - 1, lq, lk);
      if (kmax == 0) {
        std::fill(ob, ob + nb * d, A(0));
        for (int64_t r = 0; r < nb; ++r) pl[h * dm.tq + q0 + i0 + r] = neg_inf;
        scatter(ob, nb, d, po + q0 * so, so, h, i0);
        continue;
      }
      const int64_t kmin = first_visible(causal, window, i0, lq, lk), kw = kmax - kmin;
      gather(rq, q0, h, d, i0, nb, qb);
      gemm(false, true, nb, kw, d, scale, qb, d, kb + kmin * d, d, A(0), sb, kw);
      for (int64_t r = 0; r < nb; ++r) {
        A* row = sb + r * kw;
        const int64_t hi = visible(causal, i0 + r, lq, lk) - kmin;
        const int64_t lo = first_visible(causal, window, i0 + r, lq, lk) - kmin;
        A l = neg_inf;
        if (hi > lo) {
          if (cap > 0) softcap_row(row + lo, hi - lo, cap);
          A m = row[lo];
          for (int64_t j = lo + 1; j < hi; ++j) m = std::max(m, row[j]);
          const A sum = softmax_cpu::exp_shift_sum(row + lo, hi - lo, m);
          l = m + std::log(sum);
          const A inv = A(1) / sum;
          for (int64_t j = lo; j < hi; ++j) row[j] *= inv;
        }
        std::fill(row, row + std::max<int64_t>(lo, 0), A(0));
        std::fill(row + std::max(hi, lo), row + kw, A(0));
        pl[h * dm.tq + q0 + i0 + r] = l;
      }
      gemm(false, false, nb, d, kw, A(1), sb, kw, vb + kmin * d, d, A(0), ob, d);
      scatter(ob, nb, d, po + q0 * so, so, h, i0);
    }
  });
}

template <typename T>
void backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const Seqs& s, const AttentionDims& dm,
                   double scale_d, const Mask& mk, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv) {
  using A = acc_t<T>;
  const bool causal = mk.causal;
  const int64_t window = mk.window;
  const A cap = static_cast<A>(mk.softcap);
  const int64_t d = dm.d, lk_max = s.max_k, bq = std::min(kBlockQ, std::max<int64_t>(s.max_q, 1));
  const int64_t slab = 4 * lk_max * d + 3 * bq * d + (cap > 0 ? 3 : 2) * bq * lk_max + 2 * bq;
  const int threads = worker_threads(s.batch * dm.hk, 5 * score_work(s, dm));
  Tensor ws =
      Tensor::empty({threads * slab}, stat_dtype(q.dtype()), q.device(), MemTag::kWorkspace);
  A* wsp = static_cast<A*>(ws.data_ptr());
  const HeadRows<T> rq = head_rows<T>(q), rk = head_rows<T>(k), rv = head_rows<T>(v);
  const HeadRows<T> rg = head_rows<T>(dout);
  const T* po = static_cast<const T*>(out.data_ptr());
  const A* pl = static_cast<const A*>(lse.data_ptr());
  T* pdq = dq.defined() ? static_cast<T*>(dq.data_ptr()) : nullptr;
  T* pdk = dk.defined() ? static_cast<T*>(dk.data_ptr()) : nullptr;
  T* pdv = dv.defined() ? static_cast<T*>(dv.data_ptr()) : nullptr;
  const bool need_kv = pdk || pdv;
  const int64_t so = row_stride(out), sdq = dm.hq * d, sdk = dm.hk * d;
  const A scale = static_cast<A>(scale_d);

  for_tasks(s.batch * dm.hk, threads, [&](int64_t task, int thread) {
    const int64_t b = task / dm.hk, hk = task % dm.hk;
    const int64_t q0 = s.q[b], lq = s.q[b + 1] - q0, k0 = s.k[b], lk = s.k[b + 1] - k0;
    A* kb = wsp + thread * slab;
    A* vb = kb + lk_max * d;
    A* dkb = vb + lk_max * d;
    A* dvb = dkb + lk_max * d;
    A* qb = dvb + lk_max * d;
    A* gb = qb + bq * d;
    A* dqb = gb + bq * d;
    A* pb = dqb + bq * d;
    A* dpb = pb + bq * lk_max;
    A* di = dpb + bq * lk_max;
    A* lb = di + bq;
    A* tb = lb + bq;  // tanh of the soft-capped scores (soft-capping only)
    gather(rk, k0, hk, d, 0, lk, kb);
    gather(rv, k0, hk, d, 0, lk, vb);
    std::fill(dkb, dkb + lk * d, A(0));
    std::fill(dvb, dvb + lk * d, A(0));
    for (int64_t h = hk * dm.group; h < (hk + 1) * dm.group; ++h) {
      for (int64_t i0 = 0; i0 < lq; i0 += bq) {
        const int64_t nb = std::min(bq, lq - i0);
        const int64_t kmax = visible(causal, i0 + nb - 1, lq, lk);
        if (kmax == 0) {
          if (pdq) {
            std::fill(dqb, dqb + nb * d, A(0));
            scatter(dqb, nb, d, pdq + q0 * sdq, sdq, h, i0);
          }
          continue;
        }
        const int64_t kmin = first_visible(causal, window, i0, lq, lk), kw = kmax - kmin;
        A* kbw = kb + kmin * d;
        A* vbw = vb + kmin * d;
        gather(rq, q0, h, d, i0, nb, qb);
        gather(rg, q0, h, d, i0, nb, gb);
        for (int64_t r = 0; r < nb; ++r) {
          const T* orow = po + (q0 + i0 + r) * so + h * d;
          A acc = 0;
          for (int64_t j = 0; j < d; ++j) acc += gb[r * d + j] * load(orow, j);
          di[r] = acc;
          lb[r] = pl[h * dm.tq + q0 + i0 + r];
        }
        // P from the saved lse; masked and "sees nothing" entries are exactly 0.
        gemm(false, true, nb, kw, d, scale, qb, d, kbw, d, A(0), pb, kw);
        for (int64_t r = 0; r < nb; ++r) {
          A* row = pb + r * kw;
          const bool none = std::isinf(lb[r]);
          const int64_t hi = none ? 0 : visible(causal, i0 + r, lq, lk) - kmin;
          const int64_t lo = none ? 0 : first_visible(causal, window, i0 + r, lq, lk) - kmin;
          if (cap > 0 && hi > lo) {
            softcap_row(row + lo, hi - lo, cap);
            for (int64_t j = lo; j < hi; ++j) tb[r * kw + j] = row[j] / cap;
          }
          if (hi > lo) softmax_cpu::exp_shift_sum(row + lo, hi - lo, lb[r]);
          std::fill(row, row + std::max<int64_t>(lo, 0), A(0));
          std::fill(row + std::max(hi, lo), row + kw, A(0));
        }
        if (pdv) gemm(true, false, kw, d, nb, A(1), pb, kw, gb, d, A(1), dvb + kmin * d, d);
        gemm(false, true, nb, kw, d, A(1), gb, d, vbw, d, A(0), dpb, kw);
        for (int64_t r = 0; r < nb; ++r) {
          A* dp = dpb + r * kw;
          const A* p = pb + r * kw;
          for (int64_t j = 0; j < kw; ++j) dp[j] = p[j] * (dp[j] - di[r]);
          if (cap > 0) {
            const A* t = tb + r * kw;
            for (int64_t j = 0; j < kw; ++j)
              if (p[j] != A(0)) dp[j] *= A(1) - t[j] * t[j];
          }
        }
        if (pdq) {
          gemm(false, false, nb, d, kw, scale, dpb, kw, kbw, d, A(0), dqb, d);
          scatter(dqb, nb, d, pdq + q0 * sdq, sdq, h, i0);
        }
        if (pdk) gemm(true, false, kw, d, nb, scale, dpb, kw, qb, d, A(1), dkb + kmin * d, d);
      }
    }
    if (!need_kv) return;
    if (pdk) scatter(dkb, lk, d, pdk + k0 * sdk, sdk, hk, 0);
    if (pdv) scatter(dvb, lk, d, pdv + k0 * sdk, sdk, hk, 0);
  });
}

// Zeroes rows [from, rows) of a contiguous [rows, ...] tensor.
void zero_tail_rows(const Tensor& t, int64_t from) {
  if (!t.defined() || from >= t.size(0)) return;
  t.narrow(0, from, t.size(0) - from).zero_();
}

class AttentionBackward final : public Node {
 public:
  SavedTensor q, k, v, out, lse, cu_q, cu_k;
  AttentionOptions opt;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const Tensor qs = q.unpack(), ks = k.unpack(), vs = v.unpack();
    Tensor dout = grads[0];
    if (dout.dtype() != qs.dtype()) dout = dout.to(qs.dtype());
    Tensor dq, dk, dv;
    if (needs_input_grad(0)) dq = Tensor::empty(qs.shape(), qs.dtype(), qs.device());
    if (needs_input_grad(1)) dk = Tensor::empty(ks.shape(), ks.dtype(), ks.device());
    if (needs_input_grad(2)) dv = Tensor::empty(vs.shape(), vs.dtype(), vs.device());
    attention_bwd(dout, qs, ks, vs, out.unpack(), lse.unpack(), cu_q.unpack(), cu_k.unpack(), opt,
                  dq, dk, dv);
    return {dq, dk, dv};
  }
  std::string name() const override { return "AttentionBackward"; }
  void release_saved() override {
    for (SavedTensor* t : {&q, &k, &v, &out, &lse, &cu_q, &cu_k}) t->reset();
  }
};

void check_options(const char* op, const AttentionOptions& opt) {
  LT_CHECK(opt.window >= 0 && opt.softcap >= 0 && (opt.window == 0 || opt.causal), op, ": window ",
           opt.window, " (causal only), softcap ", opt.softcap);
}

}  // namespace

CudnnAttentionStatus cudnn_attention_status(int device) {
  try {
    return cudnn_attention_status_cuda(device);
  } catch (const Error& e) {  // no CUDA backend in this build or on this machine
    CudnnAttentionStatus s;
    s.why = e.what();
    return s;
  }
}

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                   const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& out,
                   const Tensor& lse) {
  ProfileScope prof(OpKind::kAttentionFwd, q.device());
  const AttentionDims dm = check_qkv_shapes("attention_fwd", q, k, v);
  check_options("attention_fwd", opt);
  LT_CHECK(out.shape() == q.shape() && out.dtype() == q.dtype() && out.is_contiguous(),
           "attention_fwd: out ", out.str(), " for q ", q.str());
  LT_CHECK(lse.shape() == (Shape{dm.hq, dm.tq}) && lse.dtype() == stat_dtype(q.dtype()) &&
               lse.is_contiguous(),
           "attention_fwd: lse ", lse.str(), " for q ", q.str(), " (want [", dm.hq, ", ", dm.tq,
           "] ", dtype_name(stat_dtype(q.dtype())), ")");
  if (q.device().is_cuda()) {
    attention_fwd_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, opt, out, lse);
    return;
  }
  const Seqs s = read_seqs(cu_seqlens_q, cu_seqlens_k, dm.tq, dm.tk, opt.total_seqlen);
  const double scale = opt.scale != 0.0 ? opt.scale : 1.0 / std::sqrt(double(dm.d));
  // Rows outside every sequence: out = 0, lse = -inf.
  zero_tail_rows(out, s.q.back());
  if (s.q.back() < dm.tq)
    lse.narrow(1, s.q.back(), dm.tq - s.q.back()).fill_(-std::numeric_limits<double>::infinity());
  if (s.q.back() == 0) return;
  const Tensor qc = rows_dense(q), kc = rows_dense(k), vc = rows_dense(v);
  const Mask mk{opt.causal, opt.window, opt.softcap};
  LT_DISPATCH_FLOAT(q.dtype(), T, forward_impl<T>(qc, kc, vc, s, dm, scale, mk, out, lse));
}

void attention_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens_q,
                   const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv) {
  ProfileScope prof(OpKind::kAttentionBwd, q.device());
  const AttentionDims dm = check_qkv_shapes("attention_bwd", q, k, v);
  check_options("attention_bwd", opt);
  LT_CHECK(dout.shape() == q.shape() && dout.dtype() == q.dtype() && out.shape() == q.shape() &&
               out.dtype() == q.dtype(),
           "attention_bwd: dout ", dout.str(), ", out ", out.str(), " for q ", q.str());
  LT_CHECK(lse.shape() == (Shape{dm.hq, dm.tq}) && lse.dtype() == stat_dtype(q.dtype()),
           "attention_bwd: lse ", lse.str(), " for q ", q.str());
  auto check_grad = [](const Tensor& g, const Tensor& x, const char* name) {
    if (g.defined())
      LT_CHECK(g.shape() == x.shape() && g.dtype() == x.dtype() && g.is_contiguous(),
               "attention_bwd: ", name, " ", g.str(), " for ", x.str());
  };
  check_grad(dq, q, "dq");
  check_grad(dk, k, "dk");
  check_grad(dv, v, "dv");
  if (q.device().is_cuda()) {
    attention_bwd_cuda(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, opt, dq, dk, dv);
    return;
  }
  const Seqs s = read_seqs(cu_seqlens_q, cu_seqlens_k, dm.tq, dm.tk, opt.total_seqlen);
  const double scale = opt.scale != 0.0 ? opt.scale : 1.0 / std::sqrt(double(dm.d));
  zero_tail_rows(dq, s.q.back());
  zero_tail_rows(dk, s.k.back());
  zero_tail_rows(dv, s.k.back());
  if (!dq.defined() && !dk.defined() && !dv.defined()) return;
  const Tensor qc = rows_dense(q), kc = rows_dense(k), vc = rows_dense(v);
  const Tensor oc = rows_dense(out), gc = rows_dense(dout);
  const Tensor lc = lse.is_contiguous() ? lse : lse.contiguous();
  const Mask mk{opt.causal, opt.window, opt.softcap};
  LT_DISPATCH_FLOAT(q.dtype(), T,
                    backward_impl<T>(gc, qc, kc, vc, oc, lc, s, dm, scale, mk, dq, dk, dv));
}

AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                          const AttentionOptions& opt) {
  const AttentionDims dm = check_qkv_shapes("attention", q, k, v);
  AttentionOutput r;
  r.out = Tensor::empty(q.shape(), q.dtype(), q.device());
  r.lse = Tensor::empty({dm.hq, dm.tq}, stat_dtype(q.dtype()), q.device());
  attention_fwd(q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k, opt, r.out, r.lse);
  if (node_needed({q, k, v})) {
    auto node = std::make_shared<AttentionBackward>();
    node->set_next_edges({q, k, v});
    node->q = SavedTensor(q);
    node->k = SavedTensor(k);
    node->v = SavedTensor(v);
    node->out = SavedTensor(r.out);
    node->lse = SavedTensor(r.lse);
    node->cu_q = SavedTensor(cu_seqlens_q);
    node->cu_k = SavedTensor(cu_seqlens_k);
    node->opt = opt;
    // lse carries no gradient: only `out` is attached to the node.
    set_history(r.out, node);
  }
  return r;
}

}  // namespace leantune::kernels
