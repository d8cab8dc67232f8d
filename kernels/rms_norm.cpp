// rms_norm: y = w * round(x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), per row; with
// unit_offset y = round((x * rstd) * (1 + w)), the weight offset formed in f32 (f64).
//   x:[T,H] (any leading shape, H last), w:[H], one float dtype -> y like x (contiguous);
//   rstd:[T] f32 (f64 for f64 x). round() is the rounding to x's dtype that Hugging Face applies
//   before the weight multiply (a no-op for f32/f64).
// Backward, with xh = x*rstd (unrounded), dxh = dy*w (dy*(1 + w) with unit_offset):
//   dx = rstd * (dxh - xh * mean(dxh * xh)),   dw = sum_t dy * round(xh) (unrounded xh with
//   unit_offset).
// The CPU backward works on fixed blocks of kRowsPerBlock rows: each block writes its dx rows
// and one partial dw row (f32/f64 scratch [blocks, H], kWorkspace); the partials are then summed
// in block order, so dw does not depend on the number of threads.
// Saved for backward: x, w, rstd.
// add_rms_norm (the residual add fused in front, rms_norm.h): on the CPU it is residual_add_fwd
// then rms_norm_fwd on the sum, so it equals the two ops by construction; CUDA fuses the pass.
// Its backward is rms_norm_bwd with the sum's own gradient as dres. Saved: sum, w, rstd.
#include "kernels/rms_norm.h"

#include <algorithm>
#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/cpu_common.h"
#include "kernels/residual.h"

namespace leantune::kernels {

namespace {

constexpr int64_t kRowsPerBlock = 32;

// Rows and hidden size of x, after checking x and w.
std::pair<int64_t, int64_t> rows_cols(const char* op, const Tensor& x, const Tensor& w) {
  LT_CHECK(x.dim() >= 1 && w.dim() == 1 && x.size(-1) == w.size(0) && x.dtype() == w.dtype() &&
               dtype_is_floating(x.dtype()),
           op, ": x ", x.str(), ", w ", w.str());
  const int64_t h = w.size(0);
  return {h == 0 ? 0 : x.numel() / h, h};
}

class RmsNormBackward final : public Node {
 public:
  SavedTensor x, w, rstd;
  bool unit_offset = false;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const Tensor xs = x.unpack(), ws = w.unpack(), rs = rstd.unpack();
    Tensor dy = grads[0];
    if (dy.dtype() != xs.dtype()) dy = dy.to(xs.dtype());
    Tensor dx, dw;
    if (needs_input_grad(0)) dx = Tensor::empty(xs.shape(), xs.dtype(), xs.device());
    if (needs_input_grad(1)) dw = Tensor::empty(ws.shape(), ws.dtype(), ws.device());
    rms_norm_bwd(dy, xs, ws, rs, dx, dw, unit_offset);
    return {dx, dw};
  }
  std::string name() const override { return "RmsNormBackward"; }
  void release_saved() override {
    x.reset();
    w.reset();
    rstd.reset();
  }
};

// Outputs: sum (grads[0]) and y (grads[1]); inputs a, b, w.
class AddRmsNormBackward final : public Node {
 public:
  SavedTensor sum, w, rstd;
  bool unit_offset = false;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor s = sum.unpack();
    auto in_dtype = [&](const Tensor& g) {
      return !g.defined() || g.dtype() == s.dtype() ? g : g.to(s.dtype());
    };
    const Tensor ds = in_dtype(grads[0]), dy = in_dtype(grads[1]);
    const bool need_sum = needs_input_grad(0) || needs_input_grad(1);
    Tensor dsum = ds, dw;
    if (dy.defined() && (need_sum || needs_input_grad(2))) {
      const Tensor ws = w.unpack();
      dsum = need_sum ? Tensor::empty(s.shape(), s.dtype(), s.device()) : Tensor();
      if (needs_input_grad(2)) dw = Tensor::empty(ws.shape(), ws.dtype(), ws.device());
      // Without a gradient for a or b there is no dsum for ds to join (w's alone is wanted).
      rms_norm_bwd(dy, s, ws, rstd.unpack(), dsum, dw, unit_offset, need_sum ? ds : Tensor());
    }
    return {needs_input_grad(0) ? dsum : Tensor(), needs_input_grad(1) ? dsum : Tensor(), dw};
  }
  std::string name() const override { return "AddRmsNormBackward"; }
  void release_saved() override {
    sum.reset();
    w.reset();
    rstd.reset();
  }
};

}  // namespace

void rms_norm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd,
                  bool unit_offset) {
  ProfileScope prof(OpKind::kNorm, x.device());
  const auto [rows, h] = rows_cols("rms_norm_fwd", x, w);
  LT_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype() && y.is_contiguous(),
           "rms_norm_fwd: y ", y.str(), " for x ", x.str());
  LT_CHECK(rstd.numel() == rows && rstd.dtype() == stat_dtype(x.dtype()) && rstd.is_contiguous(),
           "rms_norm_fwd: rstd ", rstd.str(), " for x ", x.str(), " (want [", rows, "] ",
           dtype_name(stat_dtype(x.dtype())), ")");
  if (x.device().is_cuda()) {
    rms_norm_fwd_cuda(x, w, eps, unit_offset, y, rstd);
    return;
  }
  const Tensor xc = ops::contiguous_workspace(x), wc = ops::contiguous_workspace(w);
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(xc.data_ptr());
    const T* pw = static_cast<const T*>(wc.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    A* pr = static_cast<A*>(rstd.data_ptr());
    parallel_for(rows, cpu::grain_for(h), [&](int64_t r) {
      const T* xr = px + r * h;
      T* yr = py + r * h;
      A ss = 0;
      for (int64_t j = 0; j < h; ++j) {
        const A v = load(xr, j);
        ss += v * v;
      }
      const A rs = A(1) / std::sqrt(ss / static_cast<A>(h) + static_cast<A>(eps));
      pr[r] = rs;
      for (int64_t j = 0; j < h; ++j) {
        if (unit_offset) {  // Gemma: (x * rstd) * (1 + w) in A, rounded once
          store(yr, j, (load(xr, j) * rs) * (A(1) + load(pw, j)));
          continue;
        }
        // Round x*rstd to T first, as Hugging Face's `weight * hidden.to(input_dtype)` does.
        T xh;
        store(&xh, 0, load(xr, j) * rs);
        store(yr, j, load(pw, j) * load(&xh, 0));
      }
    });
  });
}

void rms_norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                  const Tensor& dx, const Tensor& dw, bool unit_offset, const Tensor& dres) {
  ProfileScope prof(OpKind::kNorm, x.device());
  const auto [rows, h] = rows_cols("rms_norm_bwd", x, w);
  LT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), "rms_norm_bwd: dy ", dy.str(),
           " for x ", x.str());
  LT_CHECK(rstd.numel() == rows && rstd.dtype() == stat_dtype(x.dtype()), "rms_norm_bwd: rstd ",
           rstd.str(), " for x ", x.str());
  if (dx.defined())
    LT_CHECK(dx.shape() == x.shape() && dx.dtype() == x.dtype() && dx.is_contiguous(),
             "rms_norm_bwd: dx ", dx.str(), " for x ", x.str());
  if (dw.defined())
    LT_CHECK(dw.shape() == w.shape() && dw.dtype() == w.dtype() && dw.is_contiguous(),
             "rms_norm_bwd: dw ", dw.str(), " for w ", w.str());
  if (dres.defined())
    LT_CHECK(dres.shape() == x.shape() && dres.dtype() == x.dtype() && dx.defined(),
             "rms_norm_bwd: dres ", dres.str(), " for x ", x.str(), " (and dx wanted)");
  if (x.device().is_cuda()) {
    rms_norm_bwd_cuda(dy, x, w, rstd, unit_offset, dx, dw, dres);
    return;
  }
  if (!dx.defined() && !dw.defined()) return;
  const Tensor xc = ops::contiguous_workspace(x), wc = ops::contiguous_workspace(w),
               gc = ops::contiguous_workspace(dy), rc = ops::contiguous_workspace(rstd);
  const Tensor resc = dres.defined() ? ops::contiguous_workspace(dres) : Tensor();
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  Tensor partial;
  if (dw.defined())
    partial = Tensor::empty({std::max<int64_t>(blocks, 1), h}, stat_dtype(x.dtype()), x.device(),
                            MemTag::kWorkspace);
  LT_DISPATCH_FLOAT(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(xc.data_ptr());
    const T* pw = static_cast<const T*>(wc.data_ptr());
    const T* pg = static_cast<const T*>(gc.data_ptr());
    const A* pr = static_cast<const A*>(rc.data_ptr());
    T* pdx = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
    const T* pres = resc.defined() ? static_cast<const T*>(resc.data_ptr()) : nullptr;
    A* pp = dw.defined() ? static_cast<A*>(partial.data_ptr()) : nullptr;
    const A off = unit_offset ? A(1) : A(0);
    parallel_for(blocks, cpu::grain_for(kRowsPerBlock * h), [&](int64_t b) {
      A* part = pp ? pp + b * h : nullptr;
      if (part) std::fill(part, part + h, A(0));
      const int64_t r1 = std::min(rows, (b + 1) * kRowsPerBlock);
      for (int64_t r = b * kRowsPerBlock; r < r1; ++r) {
        const T* xr = px + r * h;
        const T* gr = pg + r * h;
        const A rs = pr[r];
        if (part) {
          for (int64_t j = 0; j < h; ++j) {
            if (unit_offset) {
              part[j] += load(gr, j) * (load(xr, j) * rs);
              continue;
            }
            T xh;
            store(&xh, 0, load(xr, j) * rs);
            part[j] += load(gr, j) * load(&xh, 0);
          }
        }
        if (pdx) {
          A dot = 0;
          for (int64_t j = 0; j < h; ++j)
            dot += load(gr, j) * (off + load(pw, j)) * load(xr, j) * rs;
          const A m = dot / static_cast<A>(h);
          T* dr = pdx + r * h;
          const T* rr = pres ? pres + r * h : nullptr;
          for (int64_t j = 0; j < h; ++j) {
            const A xh = load(xr, j) * rs;
            // dres[j] is read before dx[j] is written: they may share storage.
            const A res = rr ? load(rr, j) : A(0);
            T d;
            store(&d, 0, rs * (load(gr, j) * (off + load(pw, j)) - xh * m));
            store(dr, j, rr ? load(&d, 0) + res : load(&d, 0));
          }
        }
      }
    });
    if (pp) {
      T* pdw = static_cast<T*>(dw.data_ptr());
      parallel_for(h, cpu::grain_for(blocks), [&](int64_t j) {
        A s = 0;
        for (int64_t b = 0; b < blocks; ++b) s += pp[b * h + j];
        store(pdw, j, s);
      });
    }
  });
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, bool unit_offset) {
  const auto [rows, h] = rows_cols("rms_norm", x, w);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  rms_norm_fwd(x.detach(), w.detach(), eps, y, rstd, unit_offset);
  if (node_needed({x, w})) {
    auto node = std::make_shared<RmsNormBackward>();
    node->unit_offset = unit_offset;
    node->set_next_edges({x, w});
    node->x = SavedTensor(x);
    node->w = SavedTensor(w);
    node->rstd = SavedTensor(rstd);
    set_history(y, node);
  }
  return y;
}

void add_rms_norm_fwd(const Tensor& a, const Tensor& b, const Tensor& w, double eps,
                      const Tensor& sum, const Tensor& y, const Tensor& rstd, bool unit_offset) {
  rows_cols("add_rms_norm_fwd", a, w);  // checks a against w
  LT_CHECK(b.shape() == a.shape() && b.dtype() == a.dtype() && sum.shape() == a.shape() &&
               sum.dtype() == a.dtype() && sum.is_contiguous(),
           "add_rms_norm_fwd: a ", a.str(), ", b ", b.str(), ", sum ", sum.str());
  if (a.device().is_cuda()) {  // the adapter checks y and rstd as rms_norm_fwd_cuda's does
    ProfileScope prof(OpKind::kNorm, a.device());
    add_rms_norm_fwd_cuda(a, b, w, eps, unit_offset, sum, y, rstd);
    return;
  }
  residual_add_fwd(a, b, sum);
  rms_norm_fwd(sum, w, eps, y, rstd, unit_offset);
}

AddRmsNormOutput add_rms_norm(const Tensor& a, Tensor b, const Tensor& w, double eps,
                              bool unit_offset) {
  const auto [rows, h] = rows_cols("add_rms_norm", a, w);
  AddRmsNormOutput out;
  out.sum = Tensor::empty(a.shape(), a.dtype(), a.device());
  const bool reuse_b = sole_contiguous(b) && b.shape() == a.shape() && b.dtype() == a.dtype();
  out.y = reuse_b ? b.detach() : Tensor::empty(a.shape(), a.dtype(), a.device());
  Tensor rstd = Tensor::empty({rows}, stat_dtype(a.dtype()), a.device());
  add_rms_norm_fwd(a.detach(), b.detach(), w.detach(), eps, out.sum, out.y, rstd, unit_offset);
  if (node_needed({a, b, w})) {
    auto node = std::make_shared<AddRmsNormBackward>();
    node->unit_offset = unit_offset;
    node->set_next_edges({a, b, w});
    node->sum = SavedTensor(out.sum);
    node->w = SavedTensor(w);
    node->rstd = SavedTensor(rstd);
    // The sum carries a gradient only from a or b, as residual_add's would.
    set_history(std::vector<Tensor>{node_needed({a, b}) ? out.sum : Tensor(), out.y}, node);
  }
  return out;
}

}  // namespace leantune::kernels
