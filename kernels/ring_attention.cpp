// Zigzag layout, the CPU forward and backward of zigzag ring attention and its autograd node
// (see ring_attention.h). Scratch: the KV ring's two buffers [2,T,Hk,D] and, in the backward,
// the dK/dV ring's two [2,T,Hk,D] accumulators (kComm); the gathered half blocks and per-step
// partial results (kWorkspace).
#include "kernels/ring_attention.h"

#include <cmath>
#include <cstring>

#include "engine/autograd.h"
#include "engine/check.h"

namespace leantune::kernels {
namespace {

Tensor i32_tensor(const std::vector<int32_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// Copies rows [src_start[i], +len[i]) of src into consecutive rows of a new tensor.
Tensor gather_runs(const Tensor& src, const std::vector<int64_t>& starts,
                   const std::vector<int64_t>& lens) {
  int64_t rows = 0;
  for (int64_t l : lens) rows += l;
  Shape shape = src.shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, src.dtype(), Device::cpu(), MemTag::kActivation);
  const size_t row_bytes = src.nbytes() / std::max<int64_t>(src.size(0), 1);
  char* dst = static_cast<char*>(out.data_ptr());
  const char* base = static_cast<const char*>(src.data_ptr());
  for (size_t i = 0; i < starts.size(); ++i) {
    std::memcpy(dst, base + starts[i] * row_bytes, lens[i] * row_bytes);
    dst += lens[i] * row_bytes;
  }
  return out;
}

// out/lse rows `rows` (local row ids, in order) merged with a partial result over other keys:
// lse' = lse - logsigmoid(lse - lse_b), out' = out - sigmoid(lse_b - lse) (out - out_b).
template <typename T>
void merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
           const std::vector<int64_t>& rows) {
  const int64_t T_all = out.size(0), H = out.size(1), D = out.size(2);
  const int64_t Tb = out_b.size(0);
  T* o = static_cast<T*>(out.data_ptr());
  T* l = static_cast<T*>(lse.data_ptr());
  const T* ob = static_cast<const T*>(out_b.data_ptr());
  const T* lb = static_cast<const T*>(lse_b.data_ptr());
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < Tb; ++i) {
      const int64_t row = rows[i];
      const T b = lb[h * Tb + i];
      if (std::isinf(b) && b < 0) continue;  // the partial saw no key
      T& a = l[h * T_all + row];
      T* orow = o + (row * H + h) * D;
      const T* brow = ob + (i * H + h) * D;
      if (std::isinf(a) && a < 0) {
        std::memcpy(orow, brow, D * sizeof(T));
        a = b;
        continue;
      }
      const T w = T(1) / (T(1) + std::exp(a - b));  // sigmoid(b - a)
      for (int64_t d = 0; d < D; ++d) orow[d] -= w * (orow[d] - brow[d]);
      // lse - logsigmoid(lse - lse_b) = max + log(1 + exp(-|a - b|))
      a = std::max(a, b) + std::log1p(std::exp(-std::abs(a - b)));
    }
  }
}

// Runs of every document's first and second half within the local rows (c rows each).
struct HalfRuns {
  std::vector<int64_t> first_starts, second_starts, halves, second_rows;
};

HalfRuns half_runs(const ZigzagLayout& z) {
  HalfRuns h;
  for (size_t d = 0; d + 1 < z.cu_seqlens_local.size(); ++d) {
    const int64_t c = z.cu_seqlens_half[d + 1] - z.cu_seqlens_half[d];
    h.first_starts.push_back(z.cu_seqlens_local[d]);
    h.second_starts.push_back(z.cu_seqlens_local[d] + c);
    h.halves.push_back(c);
    for (int64_t i = 0; i < c; ++i) h.second_rows.push_back(z.cu_seqlens_local[d] + c + i);
  }
  return h;
}

// Columns `cols` of a [H, T] statistic (lse) -> [H, cols.size()].
Tensor gather_cols(const Tensor& stat, const std::vector<int64_t>& cols) {
  const int64_t H = stat.size(0), T = stat.size(1), n = static_cast<int64_t>(cols.size());
  Tensor out = Tensor::empty({H, n}, stat.dtype(), Device::cpu(), MemTag::kWorkspace);
  const size_t esz = dtype_size(stat.dtype());
  const char* src = static_cast<const char*>(stat.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(dst + (h * n + i) * esz, src + (h * T + cols[i]) * esz, esz);
  return out;
}

// dst rows [starts[i], +lens[i]) += consecutive rows of src (both contiguous, one dtype). With
// one run covering all rows this is dst += src.
template <typename T>
void add_runs_impl(const Tensor& dst, const std::vector<int64_t>& starts, const Tensor& src,
                   const std::vector<int64_t>& lens) {
  const int64_t row = dst.numel() / std::max<int64_t>(dst.size(0), 1);
  T* d = static_cast<T*>(dst.data_ptr());
  const T* s = static_cast<const T*>(src.data_ptr());
  for (size_t i = 0; i < starts.size(); ++i) {
    T* dr = d + starts[i] * row;
    const int64_t n = lens[i] * row;
    for (int64_t e = 0; e < n; ++e) dr[e] += s[e];
    s += n;
  }
}

void add_runs(const Tensor& dst, const std::vector<int64_t>& starts, const Tensor& src,
              const std::vector<int64_t>& lens) {
  LT_CHECK(dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous(),
           "ring attention: accumulate ", src.str(), " into ", dst.str());
  if (dst.dtype() == DType::kF64)
    add_runs_impl<double>(dst, starts, src, lens);
  else
    add_runs_impl<float>(dst, starts, src, lens);
}

void add_all(const Tensor& dst, const Tensor& src) { add_runs(dst, {0}, src, {dst.size(0)}); }

void check_inputs(const char* op, Communicator& comm, const Tensor& q, const Tensor& k,
                  const Tensor& v, const ZigzagLayout& z) {
  LT_CHECK(comm.size() == z.cp && comm.rank() == z.rank, op, ": layout for ", z.rank, "/", z.cp,
           " on rank ", comm.rank(), "/", comm.size());
  LT_CHECK(q.device().is_cpu() && (q.dtype() == DType::kF32 || q.dtype() == DType::kF64), op,
           ": CPU f32/f64, got ", q.str());
  LT_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == z.local_rows() &&
               k.size(0) == z.local_rows() && v.shape() == k.shape(),
           op, ": q ", q.str(), ", k ", k.str(), ", v ", v.str(), " for ", z.local_rows(),
           " local rows");
}

}  // namespace

ZigzagLayout zigzag_layout(const std::vector<int64_t>& lengths, int cp, int rank) {
  LT_CHECK(cp >= 1 && rank >= 0 && rank < cp, "zigzag_layout: rank ", rank, " of cp ", cp);
  ZigzagLayout z;
  z.cp = cp;
  z.rank = rank;
  z.lengths = lengths;
  z.cu_seqlens_global = {0};
  z.cu_seqlens_local = {0};
  z.cu_seqlens_half = {0};
  for (int64_t len : lengths) {
    LT_CHECK(len >= 0, "zigzag_layout: negative length ", len);
    const int64_t p = (len + 2 * cp - 1) / (2 * cp) * (2 * cp);
    const int64_t c = p / (2 * cp);
    const int64_t g0 = z.cu_seqlens_global.back();
    z.padded_lengths.push_back(p);
    z.cu_seqlens_global.push_back(static_cast<int32_t>(g0 + p));
    z.cu_seqlens_local.push_back(static_cast<int32_t>(z.cu_seqlens_local.back() + 2 * c));
    z.cu_seqlens_half.push_back(static_cast<int32_t>(z.cu_seqlens_half.back() + c));
    for (int64_t chunk : {static_cast<int64_t>(rank), static_cast<int64_t>(2 * cp - 1 - rank)}) {
      for (int64_t i = 0; i < c; ++i) {
        const int64_t pos = chunk * c + i;
        z.global_rows.push_back(g0 + pos);
        z.positions.push_back(pos);
        z.is_pad.push_back(pos >= len ? 1 : 0);
      }
    }
  }
  return z;
}

Tensor zigzag_local_rows(const Tensor& global, const ZigzagLayout& z) {
  LT_CHECK(global.device().is_cpu() && global.is_contiguous() &&
               global.size(0) == z.cu_seqlens_global.back(),
           "zigzag_local_rows: ", global.str(), " for ", z.cu_seqlens_global.back(), " rows");
  std::vector<int64_t> starts, lens;
  for (size_t d = 0; d < z.padded_lengths.size(); ++d) {
    const int64_t c = z.padded_lengths[d] / (2 * z.cp);
    starts.push_back(z.cu_seqlens_global[d] + z.rank * c);
    starts.push_back(z.cu_seqlens_global[d] + (2 * z.cp - 1 - z.rank) * c);
    lens.push_back(c);
    lens.push_back(c);
  }
  return gather_runs(global, starts, lens);
}

AttentionOutput zigzag_ring_attention_fwd(Communicator& comm, const Tensor& q_in, const Tensor& k,
                                          const Tensor& v, const ZigzagLayout& z, double scale) {
  check_inputs("zigzag_ring_attention_fwd", comm, q_in, k, v, z);
  const Tensor q = q_in.contiguous();
  const int64_t T = q.size(0), Hq = q.size(1);
  const DType acc = q.dtype();
  Tensor cu_local = i32_tensor(z.cu_seqlens_local);
  Tensor cu_half = i32_tensor(z.cu_seqlens_half);
  AttentionOptions causal;
  causal.scale = scale;
  AttentionOptions full = causal;
  full.causal = false;

  AttentionOutput res{Tensor::empty(q.shape(), q.dtype()), Tensor::empty({Hq, T}, acc)};
  if (z.cp == 1) {
    attention_fwd(q, k, v, cu_local, cu_local, causal, res.out, res.lse);
    return res;
  }
  const HalfRuns hr = half_runs(z);
  std::vector<int64_t> all_rows(T);
  for (int64_t i = 0; i < T; ++i) all_rows[i] = i;
  const Tensor q_second = gather_runs(q, hr.second_starts, hr.halves);
  const int64_t Th = q_second.size(0);
  auto merge_into = [&](const Tensor& ob, const Tensor& lb, const std::vector<int64_t>& rows) {
    if (acc == DType::kF32)
      merge<float>(res.out, res.lse, ob, lb, rows);
    else
      merge<double>(res.out, res.lse, ob, lb, rows);
  };

  // The KV ring: [2, T, Hk, D] (k then v), sent to rank+1, received from rank-1. Step s posts
  // the exchange of the KV it computes on, so the transfer runs while it computes (MPI: the
  // nonblocking calls complete at group_end).
  Shape kv_shape = {2, k.size(0), k.size(1), k.size(2)};
  Tensor kv = Tensor::empty(kv_shape, k.dtype(), Device::cpu(), MemTag::kComm);
  kv.select(0, 0).copy_(k);
  kv.select(0, 1).copy_(v);
  Tensor next = Tensor::empty(kv_shape, k.dtype(), Device::cpu(), MemTag::kComm);
  const int r = z.rank, cp = z.cp;
  for (int s = 0; s < cp; ++s) {
    const bool more = s + 1 < cp;
    if (more) {
      comm.group_start();
      comm.send(kv, (r + 1) % cp);
      comm.recv(next, (r + cp - 1) % cp);
    }
    const int j = (r - s + cp) % cp;
    const Tensor ks = kv.select(0, 0), vs = kv.select(0, 1);
    if (s == 0) {
      attention_fwd(q, ks, vs, cu_local, cu_local, causal, res.out, res.lse);
    } else if (j < r) {
      const Tensor kh = gather_runs(ks, hr.first_starts, hr.halves);
      const Tensor vh = gather_runs(vs, hr.first_starts, hr.halves);
      Tensor ob = Tensor::empty(q.shape(), q.dtype(), Device::cpu(), MemTag::kWorkspace);
      Tensor lb = Tensor::empty({Hq, T}, acc, Device::cpu(), MemTag::kWorkspace);
      attention_fwd(q, kh, vh, cu_local, cu_half, full, ob, lb);
      merge_into(ob, lb, all_rows);
    } else {
      Tensor ob = Tensor::empty(q_second.shape(), q.dtype(), Device::cpu(), MemTag::kWorkspace);
      Tensor lb = Tensor::empty({Hq, Th}, acc, Device::cpu(), MemTag::kWorkspace);
      attention_fwd(q_second, ks, vs, cu_half, cu_local, full, ob, lb);
      merge_into(ob, lb, hr.second_rows);
    }
    if (more) {
      comm.group_end();
      std::swap(kv, next);
    }
  }
  return res;
}

AttentionGrads zigzag_ring_attention_bwd(Communicator& comm, const Tensor& q_in, const Tensor& k_in,
                                         const Tensor& v_in, const Tensor& out_in,
                                         const Tensor& lse_in, const Tensor& dout_in,
                                         const ZigzagLayout& z, double scale) {
  check_inputs("zigzag_ring_attention_bwd", comm, q_in, k_in, v_in, z);
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const Tensor out = out_in.contiguous(), lse = lse_in.contiguous();
  const Tensor dout = dout_in.contiguous();
  const int64_t T = q.size(0), Hq = q.size(1);
  const DType acc = q.dtype();
  LT_CHECK(out.shape() == q.shape() && dout.shape() == q.shape() && out.dtype() == acc &&
               dout.dtype() == acc && lse.shape() == (Shape{Hq, T}) && lse.dtype() == acc,
           "zigzag_ring_attention_bwd: out ", out.str(), ", lse ", lse.str(), ", dout ", dout.str(),
           " for q ", q.str());
  Tensor cu_local = i32_tensor(z.cu_seqlens_local);
  Tensor cu_half = i32_tensor(z.cu_seqlens_half);
  AttentionOptions causal;
  causal.scale = scale;
  AttentionOptions full = causal;
  full.causal = false;

  AttentionGrads g;
  g.dq = Tensor::empty(q.shape(), acc);
  if (z.cp == 1) {
    g.dk = Tensor::empty(k.shape(), acc);
    g.dv = Tensor::empty(v.shape(), acc);
    attention_bwd(dout, q, k, v, out, lse, cu_local, cu_local, causal, g.dq, g.dk, g.dv);
    return g;
  }
  const HalfRuns hr = half_runs(z);
  const Tensor q_second = gather_runs(q, hr.second_starts, hr.halves);
  const Tensor out_second = gather_runs(out, hr.second_starts, hr.halves);
  const Tensor dout_second = gather_runs(dout, hr.second_starts, hr.halves);
  const Tensor lse_second = gather_cols(lse, hr.second_rows);
  const int64_t Th = q_second.size(0);
  const Shape kh_shape = {Th, k.size(1), k.size(2)};

  // Two rings, both to rank+1 from rank-1: the KV (cp-1 hops, as in the forward) and the dK/dV
  // accumulator of the KV this rank held one step earlier (cp hops). At step s the partial
  // dK/dV of KV_j (contributions of ranks j..r-1) arrives while this rank computes its own
  // contribution; the sum goes on at step s+1, and the last hop brings every rank the complete
  // dK/dV of its own KV.
  const Shape kv_shape = {2, k.size(0), k.size(1), k.size(2)};
  Tensor kv = Tensor::empty(kv_shape, k.dtype(), Device::cpu(), MemTag::kComm);
  kv.select(0, 0).copy_(k);
  kv.select(0, 1).copy_(v);
  Tensor kv_next = Tensor::empty(kv_shape, k.dtype(), Device::cpu(), MemTag::kComm);
  Tensor dkv = Tensor::empty(kv_shape, acc, Device::cpu(), MemTag::kComm);
  Tensor dkv_in = Tensor::empty(kv_shape, acc, Device::cpu(), MemTag::kComm);
  const int r = z.rank, cp = z.cp;
  for (int s = 0; s < cp; ++s) {
    comm.group_start();
    if (s + 1 < cp) {
      comm.send(kv, (r + 1) % cp);
      comm.recv(kv_next, (r + cp - 1) % cp);
    }
    if (s > 0) {
      comm.send(dkv, (r + 1) % cp);
      comm.recv(dkv_in, (r + cp - 1) % cp);
    }
    const int j = (r - s + cp) % cp;
    const Tensor ks = kv.select(0, 0), vs = kv.select(0, 1);
    Tensor dq_b, dk_b, dv_b;
    if (s == 0) {
      // Nothing is in flight on dkv yet: step 0 writes dq and the first dK/dV directly.
      attention_bwd(dout, q, ks, vs, out, lse, cu_local, cu_local, causal, g.dq, dkv.select(0, 0),
                    dkv.select(0, 1));
    } else if (j < r) {
      const Tensor kh = gather_runs(ks, hr.first_starts, hr.halves);
      const Tensor vh = gather_runs(vs, hr.first_starts, hr.halves);
      dq_b = Tensor::empty(q.shape(), acc, Device::cpu(), MemTag::kWorkspace);
      dk_b = Tensor::empty(kh_shape, acc, Device::cpu(), MemTag::kWorkspace);
      dv_b = Tensor::empty(kh_shape, acc, Device::cpu(), MemTag::kWorkspace);
      attention_bwd(dout, q, kh, vh, out, lse, cu_local, cu_half, full, dq_b, dk_b, dv_b);
    } else {
      dq_b = Tensor::empty(q_second.shape(), acc, Device::cpu(), MemTag::kWorkspace);
      dk_b = Tensor::empty(k.shape(), acc, Device::cpu(), MemTag::kWorkspace);
      dv_b = Tensor::empty(v.shape(), acc, Device::cpu(), MemTag::kWorkspace);
      attention_bwd(dout_second, q_second, ks, vs, out_second, lse_second, cu_half, cu_local, full,
                    dq_b, dk_b, dv_b);
    }
    comm.group_end();
    if (s > 0) {
      // dkv_in (the partial for KV_j) + this rank's contribution becomes the next dkv to send.
      if (j < r) {
        add_all(g.dq, dq_b);
        add_runs(dkv_in.select(0, 0), hr.first_starts, dk_b, hr.halves);
        add_runs(dkv_in.select(0, 1), hr.first_starts, dv_b, hr.halves);
      } else {
        add_runs(g.dq, hr.second_starts, dq_b, hr.halves);
        add_all(dkv_in.select(0, 0), dk_b);
        add_all(dkv_in.select(0, 1), dv_b);
      }
      std::swap(dkv, dkv_in);
    }
    if (s + 1 < cp) std::swap(kv, kv_next);
  }
  comm.group_start();
  comm.send(dkv, (r + 1) % cp);
  comm.recv(dkv_in, (r + cp - 1) % cp);
  comm.group_end();
  g.dk = dkv_in.select(0, 0);
  g.dv = dkv_in.select(0, 1);
  return g;
}

namespace {

class ZigzagRingAttentionBackward final : public Node {
 public:
  Communicator* comm = nullptr;
  ZigzagLayout layout;
  double scale = 0.0;
  SavedTensor q, k, v, out, lse;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    // Every rank of the ring must take part, so an undefined (zero) gradient still runs the
    // exchange with zeros.
    const Tensor qs = q.unpack();
    Tensor dout = grads[0].defined() ? grads[0] : Tensor::zeros(qs.shape(), qs.dtype());
    if (dout.dtype() != qs.dtype()) dout = dout.to(qs.dtype());
    AttentionGrads g = zigzag_ring_attention_bwd(*comm, qs, k.unpack(), v.unpack(), out.unpack(),
                                                 lse.unpack(), dout, layout, scale);
    return {needs_input_grad(0) ? g.dq : Tensor(), needs_input_grad(1) ? g.dk : Tensor(),
            needs_input_grad(2) ? g.dv : Tensor()};
  }
  std::string name() const override { return "ZigzagRingAttentionBackward"; }
  void release_saved() override {
    for (SavedTensor* t : {&q, &k, &v, &out, &lse}) t->reset();
  }
};

}  // namespace

AttentionOutput zigzag_ring_attention(Communicator& comm, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const ZigzagLayout& layout, double scale) {
  AttentionOutput r =
      zigzag_ring_attention_fwd(comm, q.detach(), k.detach(), v.detach(), layout, scale);
  if (node_needed({q, k, v})) {
    auto node = std::make_shared<ZigzagRingAttentionBackward>();
    node->set_next_edges({q, k, v});
    node->comm = &comm;
    node->layout = layout;
    node->scale = scale;
    node->q = SavedTensor(q);
    node->k = SavedTensor(k);
    node->v = SavedTensor(v);
    node->out = SavedTensor(r.out);
    node->lse = SavedTensor(r.lse);
    // lse carries no gradient: only `out` is attached to the node.
    set_history(r.out, node);
  }
  return r;
}

}  // namespace leantune::kernels
