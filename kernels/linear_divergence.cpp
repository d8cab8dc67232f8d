// linear_divergence on the CPU and its autograd node (see linear_divergence.h). Blocks of logits
// come from ops::gemm (f32 accumulation, f64 for f64); the per-element math runs in double.
#include "kernels/linear_divergence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cpu_common.h"

namespace leantune::kernels {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

DType work_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

// Per valid row: online log-sum-exp statistics of both models, then the outcomes.
struct RowStats {
  double s_max = kNegInf, s_sum = 0, s_zsum = 0, s_gap = 0;  // s_gap: sum e^zs (zs - zt)
  double t_max = kNegInf, t_sum = 0, t_gap = 0;              // t_gap: sum e^zt (zt - zs)
  double s_logz = 0, t_logz = 0;
  double jsd = 0, kl_s = 0;  // the generalized JSD and KL(p_s || m)
};

// One model's side of a chunk: its valid hidden rows in the work dtype and its head.
struct Side {
  Tensor rows;    // [c, H] work dtype
  Tensor weight;  // [V, H] contiguous
  double softcap = 0;
};

// The chunk's valid rows of hidden, contiguous, in dtype dt.
Tensor gather_rows(const Tensor& hidden, const std::vector<int64_t>& rows, size_t r0, size_t c,
                   DType dt) {
  const int64_t h = hidden.size(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(c), h}, dt, hidden.device(), MemTag::kWorkspace);
  LT_DISPATCH_FLOAT(hidden.dtype(), S, {
    const S* src = static_cast<const S*>(hidden.data_ptr());
    LT_DISPATCH_FLOAT(dt, D, {
      D* dst = static_cast<D*>(out.data_ptr());
      parallel_for(static_cast<int64_t>(c), cpu::grain_for(h), [&](int64_t i) {
        const int64_t r = rows[r0 + static_cast<size_t>(i)];
        for (int64_t j = 0; j < h; ++j)
          store(dst, i * h + j, static_cast<acc_t<D>>(load(src, r * h + j)));
      });
    });
  });
  return out;
}

// z = rows W[v0 : v0 + nb]^T as a [c, nb] block in the rows' dtype.
Tensor project(const Side& s, int64_t v0, int64_t nb) {
  Tensor z =
      Tensor::empty({s.rows.size(0), nb}, s.rows.dtype(), s.rows.device(), MemTag::kWorkspace);
  ops::gemm(s.rows, false, s.weight.narrow(0, v0, nb), true, z);
  return z;
}

// Calls f(i, j, y) for every element of block z, y its value in double (row-parallel).
template <class F>
void each(const Tensor& z, F&& f) {
  const int64_t c = z.size(0), nb = z.size(1);
  LT_DISPATCH_FLOAT(z.dtype(), T, {
    const T* p = static_cast<const T*>(z.data_ptr());
    parallel_for(c, cpu::grain_for(nb), [&](int64_t i) {
      for (int64_t j = 0; j < nb; ++j) f(i, j, static_cast<double>(load(p, i * nb + j)));
    });
  });
}

double transformed(double y, double softcap, double inv_t) {
  return (softcap > 0 ? softcap * std::tanh(y / softcap) : y) * inv_t;
}

double log_mixture(double log_ps, double log_pt, double beta) {
  const double a = log_ps + std::log1p(-beta), b = log_pt + std::log(beta);
  const double top = std::max(a, b);
  return top + std::log(std::exp(a - top) + std::exp(b - top));
}

void check(const Tensor& hs, const Tensor& ws, const Tensor& ht, const Tensor& wt,
           const Tensor& mask, const LinearDivergenceOptions& o) {
  const char* op = "linear_divergence";
  LT_CHECK(hs.dim() == 2 && ws.dim() == 2 && hs.size(1) == ws.size(1) && ws.size(0) > 0, op,
           ": student hidden ", hs.str(), ", head ", ws.str());
  LT_CHECK(ht.dim() == 2 && wt.dim() == 2 && ht.size(1) == wt.size(1), op, ": teacher hidden ",
           ht.str(), ", head ", wt.str());
  LT_CHECK(ht.size(0) == hs.size(0) && wt.size(0) == ws.size(0), op,
           ": the teacher's rows and vocabulary (", ht.str(), ", ", wt.str(),
           ") must be the student's (", hs.str(), ", ", ws.str(), ")");
  LT_CHECK(hs.dtype() == ws.dtype() && dtype_is_floating(hs.dtype()) && ht.dtype() == wt.dtype() &&
               dtype_is_floating(ht.dtype()),
           op, ": each model's hidden states and head need one float dtype (", hs.str(), ", ",
           ws.str(), "; ", ht.str(), ", ", wt.str(), ")");
  LT_CHECK(mask.dim() == 1 && mask.numel() == hs.size(0) &&
               (mask.dtype() == DType::kI32 || mask.dtype() == DType::kI64),
           op, ": mask ", mask.str(), " for ", hs.size(0), " rows");
  for (const Tensor* t : {&hs, &ws, &ht, &wt})
    LT_CHECK(t->device().is_cpu(), op, ": ", t->str(),
             " is on a GPU; the chunked divergence runs on the CPU only so far");
  LT_CHECK(o.beta >= 0 && o.beta <= 1, op, ": beta ", o.beta, " must be in [0, 1]");
  LT_CHECK(o.temperature > 0, op, ": temperature ", o.temperature, " must be > 0");
  LT_CHECK(o.student_softcap >= 0 && o.teacher_softcap >= 0, op, ": softcaps must be >= 0");
  LT_CHECK(o.chunk_tokens > 0 && o.chunk_vocab > 0, op, ": chunk sizes must be positive");
}

std::vector<int64_t> valid_rows(const Tensor& mask) {
  std::vector<int64_t> rows;
  const std::vector<int64_t> m = mask.to_i64();
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i] != 0) rows.push_back(static_cast<int64_t>(i));
  return rows;
}

int mode_of(double beta) { return beta == 0 ? 0 : beta == 1 ? 1 : 2; }

// The forward statistics of every valid row.
std::vector<RowStats> forward_stats(const Tensor& hs, const Tensor& ws, const Tensor& ht,
                                    const Tensor& wt, const std::vector<int64_t>& rows,
                                    const LinearDivergenceOptions& o) {
  const int64_t v = ws.size(0);
  const double inv_t = 1.0 / o.temperature;
  const bool jsd = mode_of(o.beta) == 2;
  std::vector<RowStats> st(rows.size());
  for (size_t r0 = 0; r0 < rows.size(); r0 += static_cast<size_t>(o.chunk_tokens)) {
    const size_t c = std::min(rows.size() - r0, static_cast<size_t>(o.chunk_tokens));
    const Side s{gather_rows(hs, rows, r0, c, work_dtype(hs.dtype())), ws, o.student_softcap};
    const Side t{gather_rows(ht, rows, r0, c, work_dtype(ht.dtype())), wt, o.teacher_softcap};
    RowStats* cs = st.data() + r0;
    for (int64_t v0 = 0; v0 < v; v0 += o.chunk_vocab) {
      const int64_t nb = std::min(o.chunk_vocab, v - v0);
      const Tensor zs = project(s, v0, nb), zt = project(t, v0, nb);
      std::vector<double> zt_row(static_cast<size_t>(c * nb));
      each(zt, [&](int64_t i, int64_t j, double y) {
        zt_row[static_cast<size_t>(i * nb + j)] = transformed(y, t.softcap, inv_t);
      });
      std::vector<double> zs_row(static_cast<size_t>(c * nb));
      each(zs, [&](int64_t i, int64_t j, double y) {
        zs_row[static_cast<size_t>(i * nb + j)] = transformed(y, s.softcap, inv_t);
      });
      parallel_for(static_cast<int64_t>(c), cpu::grain_for(nb), [&](int64_t i) {
        RowStats& r = cs[i];
        const double* a = zs_row.data() + i * nb;
        const double* b = zt_row.data() + i * nb;
        const double sm = std::max(r.s_max, *std::max_element(a, a + nb));
        const double tm = std::max(r.t_max, *std::max_element(b, b + nb));
        const double sr = r.s_max == kNegInf ? 0 : std::exp(r.s_max - sm);
        const double tr = r.t_max == kNegInf ? 0 : std::exp(r.t_max - tm);
        double ss = 0, sz = 0, sg = 0, ts = 0, tg = 0;
        for (int64_t j = 0; j < nb; ++j) {
          const double es = std::exp(a[j] - sm), et = std::exp(b[j] - tm);
          ss += es;
          sz += es * a[j];
          sg += es * (a[j] - b[j]);
          ts += et;
          tg += et * (b[j] - a[j]);
        }
        r.s_sum = r.s_sum * sr + ss;
        r.s_zsum = r.s_zsum * sr + sz;
        r.s_gap = r.s_gap * sr + sg;
        r.t_sum = r.t_sum * tr + ts;
        r.t_gap = r.t_gap * tr + tg;
        r.s_max = sm;
        r.t_max = tm;
      });
    }
    for (size_t i = 0; i < c; ++i) {
      cs[i].s_logz = cs[i].s_max + std::log(cs[i].s_sum);
      cs[i].t_logz = cs[i].t_max + std::log(cs[i].t_sum);
    }
    if (!jsd) continue;
    for (int64_t v0 = 0; v0 < v; v0 += o.chunk_vocab) {
      const int64_t nb = std::min(o.chunk_vocab, v - v0);
      const Tensor zs = project(s, v0, nb), zt = project(t, v0, nb);
      std::vector<double> log_pt(static_cast<size_t>(c * nb));
      each(zt, [&](int64_t i, int64_t j, double y) {
        log_pt[static_cast<size_t>(i * nb + j)] = transformed(y, t.softcap, inv_t) - cs[i].t_logz;
      });
      std::vector<double> jsd_part(static_cast<size_t>(c * nb)), kl_part(jsd_part.size());
      each(zs, [&](int64_t i, int64_t j, double y) {
        const size_t k = static_cast<size_t>(i * nb + j);
        const double lps = transformed(y, s.softcap, inv_t) - cs[i].s_logz, lpt = log_pt[k];
        const double lm = log_mixture(lps, lpt, o.beta);
        const double kl_s = std::exp(lps) * (lps - lm);
        kl_part[k] = kl_s;
        jsd_part[k] = o.beta * std::exp(lpt) * (lpt - lm) + (1 - o.beta) * kl_s;
      });
      for (size_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < nb; ++j) {
          cs[i].jsd += jsd_part[i * static_cast<size_t>(nb) + static_cast<size_t>(j)];
          cs[i].kl_s += kl_part[i * static_cast<size_t>(nb) + static_cast<size_t>(j)];
        }
    }
  }
  return st;
}

class LinearDivergenceBackward final : public Node {
 public:
  SavedTensor student_hidden, student_weight, teacher_hidden, teacher_weight;
  std::vector<int64_t> rows;
  std::vector<double> s_logz, t_logz, aux;  // per valid row; aux: the KL the gradient subtracts
  LinearDivergenceOptions opt;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const Tensor hs = student_hidden.unpack(), ws = student_weight.unpack();
    const Tensor ht = teacher_hidden.unpack(), wt = teacher_weight.unpack();
    const std::vector<double> g = grads[0].to_f64();
    const DType d = work_dtype(hs.dtype());
    const int64_t v = ws.size(0), h = hs.size(1);
    const bool want_dx = needs_input_grad(0), want_dw = needs_input_grad(1);
    Tensor dx = want_dx ? Tensor::zeros(hs.shape(), d, hs.device()) : Tensor();
    Tensor dw = want_dw ? Tensor::zeros(ws.shape(), d, ws.device()) : Tensor();
    const double inv_t = 1.0 / opt.temperature, beta = opt.beta;
    const int mode = mode_of(beta);
    for (size_t r0 = 0; r0 < rows.size(); r0 += static_cast<size_t>(opt.chunk_tokens)) {
      const size_t c = std::min(rows.size() - r0, static_cast<size_t>(opt.chunk_tokens));
      const Side s{gather_rows(hs, rows, r0, c, d), ws, opt.student_softcap};
      const Side t{gather_rows(ht, rows, r0, c, work_dtype(ht.dtype())), wt, opt.teacher_softcap};
      const Tensor dx_chunk =
          want_dx ? Tensor::zeros({static_cast<int64_t>(c), h}, d, hs.device(), MemTag::kWorkspace)
                  : Tensor();
      for (int64_t v0 = 0; v0 < v; v0 += opt.chunk_vocab) {
        const int64_t nb = std::min(opt.chunk_vocab, v - v0);
        const Tensor zs = project(s, v0, nb), zt = project(t, v0, nb);
        std::vector<double> log_pt(static_cast<size_t>(c) * static_cast<size_t>(nb));
        each(zt, [&](int64_t i, int64_t j, double y) {
          log_pt[static_cast<size_t>(i * nb + j)] =
              transformed(y, t.softcap, inv_t) - t_logz[r0 + static_cast<size_t>(i)];
        });
        // zs becomes the gradient block in place.
        LT_DISPATCH_FLOAT(zs.dtype(), T, {
          T* p = static_cast<T*>(zs.data_ptr());
          parallel_for(static_cast<int64_t>(c), cpu::grain_for(nb), [&](int64_t i) {
            const size_t row = r0 + static_cast<size_t>(i);
            for (int64_t j = 0; j < nb; ++j) {
              const double y = static_cast<double>(load(p, i * nb + j));
              const double th = opt.student_softcap > 0 ? std::tanh(y / opt.student_softcap) : 0;
              const double z = (opt.student_softcap > 0 ? opt.student_softcap * th : y) * inv_t;
              const double lps = z - s_logz[row], lpt = log_pt[static_cast<size_t>(i * nb + j)];
              const double ps = std::exp(lps);
              double gz = mode == 0 ? ps - std::exp(lpt)
                          : mode == 1
                              ? ps * (lps - lpt - aux[row])
                              : (1 - beta) * ps * (lps - log_mixture(lps, lpt, beta) - aux[row]);
              gz *= g[static_cast<size_t>(rows[row])] * inv_t;
              if (opt.student_softcap > 0) gz *= 1 - th * th;
              store(p, i * nb + j, static_cast<acc_t<T>>(gz));
            }
          });
        });
        if (want_dx) ops::gemm(zs, false, ws.narrow(0, v0, nb), false, dx_chunk, 1.0, 1.0);
        if (want_dw) ops::gemm(zs, true, s.rows, false, dw.narrow(0, v0, nb), 1.0, 1.0);
      }
      if (!want_dx) continue;
      LT_DISPATCH_FLOAT(d, A, {
        const A* src = static_cast<const A*>(dx_chunk.data_ptr());
        A* dst = static_cast<A*>(dx.data_ptr());
        for (size_t i = 0; i < c; ++i)
          std::copy(src + i * static_cast<size_t>(h), src + (i + 1) * static_cast<size_t>(h),
                    dst + rows[r0 + i] * h);
      });
    }
    Tensor out_dx, out_dw;
    if (want_dx) out_dx = dx.dtype() == hs.dtype() ? dx : dx.to(hs.dtype());
    if (want_dw) out_dw = dw.dtype() == ws.dtype() ? dw : dw.to(ws.dtype());
    return {out_dx, out_dw};
  }
  std::string name() const override { return "LinearDivergenceBackward"; }
  void release_saved() override {
    student_hidden.reset();
    student_weight.reset();
    teacher_hidden.reset();
    teacher_weight.reset();
  }
};

}  // namespace

LinearDivergence linear_divergence(const Tensor& student_hidden, const Tensor& student_weight,
                                   const Tensor& teacher_hidden, const Tensor& teacher_weight,
                                   const Tensor& mask, const LinearDivergenceOptions& opt) {
  check(student_hidden, student_weight, teacher_hidden, teacher_weight, mask, opt);
  const Tensor hs = student_hidden.detach().contiguous();
  const Tensor ws = student_weight.detach().contiguous();
  const Tensor ht = teacher_hidden.detach().contiguous();
  const Tensor wt = teacher_weight.detach().contiguous();
  const std::vector<int64_t> rows = valid_rows(mask);
  const std::vector<RowStats> st = forward_stats(hs, ws, ht, wt, rows, opt);
  const int64_t n = hs.size(0);
  const DType out_dt = work_dtype(hs.dtype());
  std::vector<double> div(static_cast<size_t>(n), 0.0), ent(static_cast<size_t>(n), 0.0);
  std::vector<double> s_logz(rows.size()), t_logz(rows.size()), aux(rows.size());
  const int mode = mode_of(opt.beta);
  for (size_t k = 0; k < rows.size(); ++k) {
    const RowStats& r = st[k];
    const double fwd = r.t_gap / r.t_sum - r.t_logz + r.s_logz;
    const double rev = r.s_gap / r.s_sum - r.s_logz + r.t_logz;
    const double d = mode == 0 ? fwd : mode == 1 ? rev : r.jsd;
    div[static_cast<size_t>(rows[k])] = d;
    ent[static_cast<size_t>(rows[k])] = r.s_logz - r.s_zsum / r.s_sum;
    s_logz[k] = r.s_logz;
    t_logz[k] = r.t_logz;
    aux[k] = mode == 2 ? r.kl_s : d;
  }
  LinearDivergence out;
  out.divergence = Tensor::from_vector<double>(div, {n}).to(out_dt);
  out.entropy = Tensor::from_vector<double>(ent, {n}).to(out_dt);
  if (node_needed({student_hidden, student_weight})) {
    auto node = std::make_shared<LinearDivergenceBackward>();
    node->set_next_edges({student_hidden, student_weight});
    node->student_hidden = SavedTensor(hs);
    node->student_weight = SavedTensor(ws);
    node->teacher_hidden = SavedTensor(ht);
    node->teacher_weight = SavedTensor(wt);
    node->rows = rows;
    node->s_logz = std::move(s_logz);
    node->t_logz = std::move(t_logz);
    node->aux = std::move(aux);
    node->opt = opt;
    set_history(out.divergence, node);
  }
  return out;
}

}  // namespace leantune::kernels
