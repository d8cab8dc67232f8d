// linear_divergence and its autograd node (see linear_divergence.h), one source for the CPU and
// CUDA: blocks of logits come from ops::gemm (f32 accumulation, f64 for f64), the row passes from
// kernels/divergence_blocks.h, the valid rows are gathered with ops::index_rows and the hidden
// states' gradient scattered back with embedding_bwd (the rows are distinct, so its sum is a
// copy).
#include "kernels/linear_divergence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/divergence_blocks.h"
#include "kernels/embedding.h"

namespace leantune::kernels {

namespace {

DType work_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }
// The row statistics' dtype: double on the host, the work dtype on CUDA.
DType stats_dtype(Device dev, DType d) { return dev.is_cuda() ? d : DType::kF64; }

// z = rows W[v0 : v0 + nb]^T as a [c, nb] block in dtype d.
Tensor project(const Tensor& rows, const Tensor& weight, int64_t v0, int64_t nb, DType d) {
  const DType own = work_dtype(rows.dtype());
  Tensor z = Tensor::empty({rows.size(0), nb}, own, rows.device(), MemTag::kWorkspace);
  ops::gemm(rows, false, weight.narrow(0, v0, nb), true, z);
  return own == d ? z : z.to(d);
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
  for (const Tensor* t : {&ws, &ht, &wt})
    LT_CHECK(t->device() == hs.device(), op, ": ", t->str(), " and the student's hidden states ",
             hs.str(), " must be on one device");
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

DivergenceBlockParams params_of(const LinearDivergenceOptions& o) {
  return {1.0 / o.temperature, o.student_softcap, o.teacher_softcap, o.beta};
}

// Calls f(r0, c, xs, xt) for each chunk of valid rows, with the chunk's gathered hidden rows.
template <class F>
void each_chunk(const Tensor& hs, const Tensor& ht, const Tensor& ids, int64_t chunk, F&& f) {
  const int64_t n = ids.numel();
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t c = std::min(chunk, n - r0);
    const Tensor idc = ids.narrow(0, r0, c);
    f(r0, c, ops::index_rows(hs, idc), ops::index_rows(ht, idc));
  }
}

// The statistics of every valid row ([R, kDivStats], DivStat columns), on the inputs' device.
Tensor forward_stats(const Tensor& hs, const Tensor& ws, const Tensor& ht, const Tensor& wt,
                     const Tensor& ids, const LinearDivergenceOptions& o) {
  const int64_t v = ws.size(0), n = ids.numel();
  const DType d = work_dtype(hs.dtype());
  const DivergenceBlockParams p = params_of(o);
  std::vector<double> init(static_cast<size_t>(n * kDivStats), 0.0);
  for (int64_t i = 0; i < n; ++i)
    init[i * kDivStats + kSMax] = init[i * kDivStats + kTMax] =
        -std::numeric_limits<double>::infinity();
  const Tensor stats = Tensor::from_vector(init, {n, kDivStats})
                           .to(hs.device(), stats_dtype(hs.device(), d), MemTag::kWorkspace);
  each_chunk(
      hs, ht, ids, o.chunk_tokens, [&](int64_t r0, int64_t c, const Tensor& xs, const Tensor& xt) {
        const Tensor st = stats.narrow(0, r0, c);
        for (int64_t v0 = 0; v0 < v; v0 += o.chunk_vocab) {
          const int64_t nb = std::min(o.chunk_vocab, v - v0);
          divergence_block_stats(project(xs, ws, v0, nb, d), project(xt, wt, v0, nb, d), p, st);
        }
        if (mode_of(o.beta) != 2) return;
        for (int64_t v0 = 0; v0 < v; v0 += o.chunk_vocab) {
          const int64_t nb = std::min(o.chunk_vocab, v - v0);
          divergence_block_jsd(project(xs, ws, v0, nb, d), project(xt, wt, v0, nb, d), p, st);
        }
      });
  return stats;
}

class LinearDivergenceBackward final : public Node {
 public:
  SavedTensor student_hidden, student_weight, teacher_hidden, teacher_weight, ids;
  std::vector<int64_t> rows;
  std::vector<double> s_logz, t_logz, aux;  // per valid row; aux: the KL the gradient subtracts
  LinearDivergenceOptions opt;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const Tensor hs = student_hidden.unpack(), ws = student_weight.unpack();
    const Tensor ht = teacher_hidden.unpack(), wt = teacher_weight.unpack();
    const Tensor id = ids.unpack();
    const std::vector<double> g = grads[0].to_f64();
    const Device dev = hs.device();
    const DType d = work_dtype(hs.dtype());
    const int64_t v = ws.size(0), h = hs.size(1), n = static_cast<int64_t>(rows.size());
    const bool want_dx = needs_input_grad(0), want_dw = needs_input_grad(1);
    std::vector<double> tab(static_cast<size_t>(n) * 4);
    for (size_t k = 0; k < rows.size(); ++k) {
      tab[k * 4] = s_logz[k];
      tab[k * 4 + 1] = t_logz[k];
      tab[k * 4 + 2] = aux[k];
      tab[k * 4 + 3] = g[static_cast<size_t>(rows[k])] / opt.temperature;
    }
    const Tensor rowtab =
        Tensor::from_vector(tab, {n, 4}).to(dev, stats_dtype(dev, d), MemTag::kWorkspace);
    const Tensor dxv = want_dx ? Tensor::zeros({n, h}, d, dev, MemTag::kWorkspace) : Tensor();
    Tensor dw = want_dw ? Tensor::zeros(ws.shape(), d, dev) : Tensor();
    const DivergenceBlockParams p = params_of(opt);
    // On CUDA a bf16 student's gradient block is bf16, so both products run on bf16 operands.
    const bool bf16_block = dev.is_cuda() && hs.dtype() == DType::kBF16;
    each_chunk(
        hs, ht, id, opt.chunk_tokens,
        [&](int64_t r0, int64_t c, const Tensor& xs, const Tensor& xt) {
          for (int64_t v0 = 0; v0 < v; v0 += opt.chunk_vocab) {
            const int64_t nb = std::min(opt.chunk_vocab, v - v0);
            const Tensor zs = project(xs, ws, v0, nb, d);
            const Tensor dz =
                bf16_block ? Tensor::empty({c, nb}, DType::kBF16, dev, MemTag::kWorkspace) : zs;
            divergence_block_grad(zs, project(xt, wt, v0, nb, d), p, rowtab.narrow(0, r0, c), dz);
            if (want_dx)
              ops::gemm(dz, false, ws.narrow(0, v0, nb), false, dxv.narrow(0, r0, c), 1.0, 1.0);
            if (want_dw) ops::gemm(dz, true, xs, false, dw.narrow(0, v0, nb), 1.0, 1.0);
          }
        });
    Tensor out_dx, out_dw;
    if (want_dx) {
      out_dx = Tensor::empty(hs.shape(), hs.dtype(), dev);
      if (n == 0)
        ops::fill(out_dx, 0.0);
      else
        embedding_bwd(dxv, id, out_dx);
    }
    if (want_dw) out_dw = dw.dtype() == ws.dtype() ? dw : dw.to(ws.dtype());
    return {out_dx, out_dw};
  }
  std::string name() const override { return "LinearDivergenceBackward"; }
  void release_saved() override {
    student_hidden.reset();
    student_weight.reset();
    teacher_hidden.reset();
    teacher_weight.reset();
    ids.reset();
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
  const Device dev = hs.device();
  const std::vector<int64_t> rows = valid_rows(mask);
  const int64_t nv = static_cast<int64_t>(rows.size());
  const Tensor ids = Tensor::from_vector(rows, {nv}).to(dev);
  const std::vector<double> st = forward_stats(hs, ws, ht, wt, ids, opt).to_f64();
  const int64_t n = hs.size(0);
  const DType out_dt = work_dtype(hs.dtype());
  std::vector<double> div(static_cast<size_t>(n), 0.0), ent(static_cast<size_t>(n), 0.0);
  std::vector<double> s_logz(rows.size()), t_logz(rows.size()), aux(rows.size());
  const int mode = mode_of(opt.beta);
  for (size_t k = 0; k < rows.size(); ++k) {
    const double* r = st.data() + k * kDivStats;
    const double sl = r[kSMax] + std::log(r[kSSum]), tl = r[kTMax] + std::log(r[kTSum]);
    const double fwd = r[kTGap] / r[kTSum] - tl + sl;
    const double rev = r[kSGap] / r[kSSum] - sl + tl;
    const double d = mode == 0 ? fwd : mode == 1 ? rev : r[kJsd];
    div[static_cast<size_t>(rows[k])] = d;
    ent[static_cast<size_t>(rows[k])] = sl - r[kSZSum] / r[kSSum];
    s_logz[k] = sl;
    t_logz[k] = tl;
    aux[k] = mode == 2 ? r[kKlS] : d;
  }
  LinearDivergence out;
  out.divergence = Tensor::from_vector<double>(div, {n}).to(dev, out_dt, current_mem_tag());
  out.entropy = Tensor::from_vector<double>(ent, {n}).to(dev, out_dt, current_mem_tag());
  if (node_needed({student_hidden, student_weight})) {
    auto node = std::make_shared<LinearDivergenceBackward>();
    node->set_next_edges({student_hidden, student_weight});
    node->student_hidden = SavedTensor(hs);
    node->student_weight = SavedTensor(ws);
    node->teacher_hidden = SavedTensor(ht);
    node->teacher_weight = SavedTensor(wt);
    node->ids = SavedTensor(ids);
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
