// sequence_logprobs: see the header. Host-side bookkeeping (runs, pieces, per-sequence sums in
// double) around device-agnostic ops, so one source serves the CPU and CUDA backends.
#include "kernels/sequence_logprobs.h"

#include <algorithm>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cross_entropy.h"

namespace leantune::kernels {

namespace {

DType work_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

// A stretch of consecutive counted rows [start, start + len) of sequence `seq`, placed at
// rows [at, at + len) of its chunk.
struct Piece {
  int64_t seq, start, len, at;
};

struct Layout {
  std::vector<std::vector<Piece>> chunks;  // each at most chunk_tokens rows
  std::vector<int64_t> chunk_rows;
  std::vector<int64_t> tokens;  // counted rows per sequence
  int64_t num_seqs = 0;
};

// Splits the counted rows into runs per sequence, and the runs into chunks of at most `cap`
// rows (a chunk may hold pieces of several sequences).
Layout make_layout(const Tensor& targets, const Tensor& cu_seqlens, int64_t cap, const char* op) {
  LT_CHECK(targets.dim() == 1 && targets.device().is_cpu() &&
               (targets.dtype() == DType::kI32 || targets.dtype() == DType::kI64),
           op, ": targets ", targets.str(), " must be host [T] i32|i64");
  LT_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1 && cu_seqlens.device().is_cpu() &&
               (cu_seqlens.dtype() == DType::kI32 || cu_seqlens.dtype() == DType::kI64),
           op, ": cu_seqlens ", cu_seqlens.str(), " must be host [B+1] i32|i64");
  LT_CHECK(cap > 0, op, ": chunk_tokens ", cap, " must be positive");
  const std::vector<int64_t> y = targets.to_i64(), cu = cu_seqlens.to_i64();
  LT_CHECK(cu.front() == 0 && cu.back() == static_cast<int64_t>(y.size()), op, ": cu_seqlens [",
           cu.front(), " .. ", cu.back(), "] does not cover the ", y.size(), " targets");
  Layout l;
  l.num_seqs = static_cast<int64_t>(cu.size()) - 1;
  l.tokens.assign(static_cast<size_t>(l.num_seqs), 0);
  std::vector<Piece> cur;
  int64_t used = 0;
  auto flush = [&] {
    if (used == 0) return;
    l.chunks.push_back(std::move(cur));
    l.chunk_rows.push_back(used);
    cur.clear();
    used = 0;
  };
  for (int64_t b = 0; b < l.num_seqs; ++b) {
    LT_CHECK(cu[b + 1] >= cu[b], op, ": cu_seqlens decreases at ", b);
    int64_t t = cu[b];
    while (t < cu[b + 1]) {
      if (y[t] == kIgnoreIndex) {
        ++t;
        continue;
      }
      int64_t e = t;
      while (e < cu[b + 1] && y[e] != kIgnoreIndex) ++e;
      l.tokens[b] += e - t;
      // The run [t, e), cut where chunks fill up.
      while (t < e) {
        const int64_t n = std::min(e - t, cap - used);
        cur.push_back({b, t, n, used});
        used += n;
        t += n;
        if (used == cap) flush();
      }
    }
  }
  flush();
  return l;
}

// Copies the pieces' rows of `src` ([T, H]) into rows [0, c) of `dst`, or back when `to_src`.
void move_rows(const Tensor& rows_buf, const Tensor& full, const std::vector<Piece>& pieces,
               bool to_full) {
  for (const Piece& p : pieces) {
    Tensor a = rows_buf.narrow(0, p.at, p.len), b = full.narrow(0, p.start, p.len);
    if (to_full)
      ops::copy(b, a);
    else
      ops::copy(a, b);
  }
}

// Per-chunk targets on the device, gathered once.
std::vector<Tensor> chunk_targets(const Layout& l, const Tensor& targets, Device dev) {
  const std::vector<int64_t> y = targets.to_i64();
  std::vector<Tensor> out;
  for (size_t c = 0; c < l.chunks.size(); ++c) {
    std::vector<int64_t> v(static_cast<size_t>(l.chunk_rows[c]));
    for (const Piece& p : l.chunks[c])
      for (int64_t i = 0; i < p.len; ++i) v[p.at + i] = y[p.start + i];
    out.push_back(Tensor::from_vector(v, {l.chunk_rows[c]}).to(dev));
  }
  return out;
}

Tensor logps_tensor(const std::vector<double>& sums, DType d, Device dev) {
  return Tensor::from_doubles(sums, {static_cast<int64_t>(sums.size())}, d).to(dev);
}

// The per-row values a chunk adds to its sequences: the nll rows and, per option, the logit
// sums, entropies and top-1 flags. nll and lse hold cross_entropy_fwd's output for z; ent and
// top are scratch rows (defined when opt.row_stats).
struct RowValues {
  std::vector<double> nll, zsum, entropy, top1;
};

RowValues row_values(const Tensor& z, const Tensor& y, const Tensor& nll, const Tensor& lse,
                     const Tensor& ent, const Tensor& top, const SequenceLogprobsOptions& opt) {
  RowValues rv;
  rv.nll = nll.to_f64();
  if (opt.logit_sums) rv.zsum = ops::sum_dim(z, 1).to_f64();
  if (opt.row_stats) {
    cross_entropy_row_stats(z, y, lse, ent, top);
    rv.entropy = ent.to_f64();
    rv.top1 = top.to_f64();
  }
  return rv;
}

// The result before any row is added: token counts, zero sums for the options asked for.
SequenceLogprobs empty_result(const Layout& layout, const SequenceLogprobsOptions& opt,
                              std::vector<double>* sums) {
  SequenceLogprobs r;
  r.tokens = layout.tokens;
  sums->assign(static_cast<size_t>(layout.num_seqs), 0.0);
  if (opt.logit_sums) r.logit_sums.assign(sums->size(), 0.0);
  if (opt.row_stats) {
    r.entropy_sums.assign(sums->size(), 0.0);
    r.top1_counts.assign(sums->size(), 0);
  }
  return r;
}

// Adds rows [at, at + len) of rv (vocabulary v) to sequence seq: logp -= nll, in row order.
void add_rows(const RowValues& rv, int64_t at, int64_t len, int64_t seq, int64_t v,
              const SequenceLogprobsOptions& opt, std::vector<double>& sums, SequenceLogprobs& r) {
  for (int64_t i = 0; i < len; ++i) {
    sums[seq] -= rv.nll[at + i];
    if (opt.logit_sums) r.logit_sums[seq] += rv.zsum[at + i] / static_cast<double>(v);
    if (opt.row_stats) {
      r.entropy_sums[seq] += rv.entropy[at + i];
      r.top1_counts[seq] += rv.top1[at + i] > 0.5 ? 1 : 0;
    }
  }
}

class LinearSequenceLogprobsBackward final : public Node {
 public:
  SavedTensor hidden, weight;
  Layout layout;
  std::vector<Tensor> targets;  // per chunk, on the device (small)
  double logit_scale = 1.0;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const std::vector<double> g = grads[0].to_f64();
    const Tensor x = hidden.unpack(), w0 = weight.unpack();
    const DType d = work_dtype(x.dtype());
    const Device dev = x.device();
    Tensor w = w0;
    if (w.dtype() != d || !w.is_contiguous()) {
      w = Tensor::empty(w0.shape(), d, dev, MemTag::kWorkspace);
      ops::copy(w, w0);
    }
    Tensor dx, dw;
    if (needs_input_grad(0)) dx = Tensor::zeros(x.shape(), x.dtype(), dev, MemTag::kActivation);
    if (needs_input_grad(1)) dw = Tensor::zeros(w0.shape(), d, dev, MemTag::kGrad);
    const int64_t h = x.size(1), v = w.size(0);
    const int64_t cap = layout.chunk_rows.empty()
                            ? 0
                            : *std::max_element(layout.chunk_rows.begin(), layout.chunk_rows.end());
    if (cap == 0) return {dx, dw};
    Tensor xbuf = Tensor::empty({cap, h}, d, dev, MemTag::kWorkspace);
    Tensor zbuf = Tensor::empty({cap, v}, d, dev, MemTag::kWorkspace);
    Tensor dzbuf = Tensor::empty({cap, v}, d, dev, MemTag::kWorkspace);
    Tensor nll = Tensor::empty({cap}, d, dev, MemTag::kWorkspace);
    Tensor lse = Tensor::empty({cap}, d, dev, MemTag::kWorkspace);
    Tensor dxbuf;
    if (dx.defined()) dxbuf = Tensor::empty({cap, h}, d, dev, MemTag::kWorkspace);
    for (size_t c = 0; c < layout.chunks.size(); ++c) {
      const int64_t n = layout.chunk_rows[c];
      const auto& pieces = layout.chunks[c];
      Tensor xc = xbuf.narrow(0, 0, n), zc = zbuf.narrow(0, 0, n), dzc = dzbuf.narrow(0, 0, n);
      Tensor lc = lse.narrow(0, 0, n);
      move_rows(xc, x, pieces, false);
      ops::gemm(xc, false, w, true, zc, logit_scale, 0.0);
      cross_entropy_fwd(zc, targets[c], nll.narrow(0, 0, n), lc);
      // d logp / dz = onehot - softmax: cross_entropy_bwd's (softmax - onehot) scaled by -g_b,
      // times logit_scale for z = s x W^T.
      for (const Piece& p : pieces)
        cross_entropy_bwd(zc.narrow(0, p.at, p.len), targets[c].narrow(0, p.at, p.len),
                          lc.narrow(0, p.at, p.len), -g[p.seq] * logit_scale,
                          dzc.narrow(0, p.at, p.len));
      if (dx.defined()) {
        Tensor dxc = dxbuf.narrow(0, 0, n);
        ops::gemm(dzc, false, w, false, dxc, 1.0, 0.0);
        move_rows(dxc, dx, pieces, true);
      }
      if (dw.defined()) ops::gemm(dzc, true, xc, false, dw, 1.0, 1.0);
    }
    return {dx, dw};
  }
  std::string name() const override { return "LinearSequenceLogprobsBackward"; }
  void release_saved() override {
    hidden.reset();
    weight.reset();
    targets.clear();
  }
};

class LogitsSequenceLogprobsBackward final : public Node {
 public:
  SavedTensor logits, lse, targets;  // logits: already times logit_scale
  Layout layout;
  double logit_scale = 1.0;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined() || !needs_input_grad(0)) return {Tensor()};
    const std::vector<double> g = grads[0].to_f64();
    const Tensor z = logits.unpack(), e = lse.unpack(), y = targets.unpack();
    Tensor dz = Tensor::zeros(z.shape(), z.dtype(), z.device(), MemTag::kActivation);
    for (const auto& chunk : layout.chunks)
      for (const Piece& p : chunk)
        cross_entropy_bwd(z.narrow(0, p.start, p.len), y.narrow(0, p.start, p.len),
                          e.narrow(0, p.start, p.len), -g[p.seq] * logit_scale,
                          dz.narrow(0, p.start, p.len));
    return {dz};
  }
  std::string name() const override { return "LogitsSequenceLogprobsBackward"; }
  void release_saved() override {
    logits.reset();
    lse.reset();
    targets.reset();
  }
};

}  // namespace

SequenceLogprobs linear_sequence_logprobs(const Tensor& hidden, const Tensor& weight,
                                          const Tensor& targets, const Tensor& cu_seqlens,
                                          const SequenceLogprobsOptions& opt) {
  const char* op = "linear_sequence_logprobs";
  LT_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) &&
               weight.size(0) > 0 && hidden.size(0) == targets.numel(),
           op, ": hidden ", hidden.str(), ", weight ", weight.str(), ", targets ", targets.str());
  LT_CHECK(hidden.dtype() == weight.dtype() && dtype_is_floating(hidden.dtype()) &&
               hidden.device() == weight.device(),
           op, ": hidden ", hidden.str(), " and weight ", weight.str(),
           " need one float dtype and device");
  LT_CHECK(opt.logit_scale > 0, op, ": logit_scale ", opt.logit_scale, " must be positive");
  Layout layout = make_layout(targets, cu_seqlens, opt.chunk_tokens, op);
  const DType d = work_dtype(hidden.dtype());
  const Device dev = hidden.device();
  const int64_t h = hidden.size(1), v = weight.size(0);
  std::vector<Tensor> tgt = chunk_targets(layout, targets, dev);
  std::vector<double> sums;
  SequenceLogprobs r = empty_result(layout, opt, &sums);
  if (!layout.chunks.empty()) {
    const Tensor x = hidden.detach();
    Tensor w = weight.detach();
    if (w.dtype() != d || !w.is_contiguous()) {
      w = Tensor::empty(weight.shape(), d, dev, MemTag::kWorkspace);
      ops::copy(w, weight.detach());
    }
    const int64_t cap = *std::max_element(layout.chunk_rows.begin(), layout.chunk_rows.end());
    Tensor xbuf = Tensor::empty({cap, h}, d, dev, MemTag::kWorkspace);
    Tensor zbuf = Tensor::empty({cap, v}, d, dev, MemTag::kWorkspace);
    Tensor nll = Tensor::empty({cap}, d, dev, MemTag::kWorkspace);
    Tensor lse = Tensor::empty({cap}, d, dev, MemTag::kWorkspace);
    Tensor ent, top;
    if (opt.row_stats) {
      ent = Tensor::empty({cap}, d, dev, MemTag::kWorkspace);
      top = Tensor::empty({cap}, d, dev, MemTag::kWorkspace);
    }
    for (size_t c = 0; c < layout.chunks.size(); ++c) {
      const int64_t n = layout.chunk_rows[c];
      const auto& pieces = layout.chunks[c];
      Tensor xc = xbuf.narrow(0, 0, n), zc = zbuf.narrow(0, 0, n), nc = nll.narrow(0, 0, n);
      move_rows(xc, x, pieces, false);
      ops::gemm(xc, false, w, true, zc, opt.logit_scale, 0.0);
      cross_entropy_fwd(zc, tgt[c], nc, lse.narrow(0, 0, n));
      const RowValues rv = row_values(zc, tgt[c], nc, lse.narrow(0, 0, n),
                                      opt.row_stats ? ent.narrow(0, 0, n) : Tensor(),
                                      opt.row_stats ? top.narrow(0, 0, n) : Tensor(), opt);
      for (const Piece& p : pieces) add_rows(rv, p.at, p.len, p.seq, v, opt, sums, r);
    }
  }
  r.logps = logps_tensor(sums, d, dev);
  if (node_needed({hidden, weight})) {
    auto node = std::make_shared<LinearSequenceLogprobsBackward>();
    node->set_next_edges({hidden, weight});
    node->hidden = SavedTensor(hidden);
    node->weight = SavedTensor(weight);
    node->layout = std::move(layout);
    node->targets = std::move(tgt);
    node->logit_scale = opt.logit_scale;
    set_history(r.logps, node);
  }
  return r;
}

SequenceLogprobs logits_sequence_logprobs(const Tensor& logits, const Tensor& targets,
                                          const Tensor& cu_seqlens,
                                          const SequenceLogprobsOptions& opt) {
  const char* op = "logits_sequence_logprobs";
  LT_CHECK(
      logits.dim() == 2 && logits.size(0) == targets.numel() && dtype_is_floating(logits.dtype()),
      op, ": logits ", logits.str(), ", targets ", targets.str());
  Layout layout = make_layout(targets, cu_seqlens, opt.chunk_tokens, op);
  const DType d = work_dtype(logits.dtype());
  const Device dev = logits.device();
  const int64_t t = logits.size(0), v = logits.size(1);
  LT_CHECK(opt.logit_scale > 0, op, ": logit_scale ", opt.logit_scale, " must be positive");
  // The scaled logits are what softmax sees (and what backward re-reads).
  const Tensor z =
      opt.logit_scale == 1.0 ? logits.detach() : ops::scale(logits.detach(), opt.logit_scale);
  Tensor y = targets.to(dev);
  Tensor nll = Tensor::empty({t}, d, dev, MemTag::kActivation);
  Tensor lse = Tensor::empty({t}, d, dev, MemTag::kActivation);
  cross_entropy_fwd(z, y, nll, lse);
  Tensor ent, top;
  if (opt.row_stats) {
    ent = Tensor::empty({t}, d, dev, MemTag::kWorkspace);
    top = Tensor::empty({t}, d, dev, MemTag::kWorkspace);
  }
  const RowValues rv = row_values(z, y, nll, lse, ent, top, opt);
  std::vector<double> sums;
  SequenceLogprobs r = empty_result(layout, opt, &sums);
  for (const auto& chunk : layout.chunks)
    for (const Piece& p : chunk) add_rows(rv, p.start, p.len, p.seq, v, opt, sums, r);
  r.logps = logps_tensor(sums, d, dev);
  if (node_needed({logits})) {
    auto node = std::make_shared<LogitsSequenceLogprobsBackward>();
    node->set_next_edges({logits});
    node->logits = SavedTensor(z);
    node->lse = SavedTensor(lse);
    node->logit_scale = opt.logit_scale;
    node->targets = SavedTensor(y);
    node->layout = std::move(layout);
    set_history(r.logps, node);
  }
  return r;
}

}  // namespace leantune::kernels
