// Zigzag layout, the forward and backward of zigzag ring attention and its autograd node (see
// ring_attention.h). One driver for both devices: the attention blocks dispatch by device inside
// kernels::attention_fwd/bwd; the row work between blocks (gather of half blocks, log-sum-exp
// merge, stat gather, dK/dV scatter-add) runs as host loops on the CPU and as the ring_*_cuda
// kernels (ring_attention.cu) on CUDA, with their row ids uploaded once per call.
// Scratch: the KV ring's two buffers [2,T,Hk,D] and, in the backward, the dK/dV ring's two
// [2,T,Hk,D] accumulators (kComm); the gathered half blocks, per-step partial results, the f32
// running out / dQ of 16-bit input and the CUDA row ids (kWorkspace).
#include "kernels/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/autograd.h"
#include "engine/check.h"
#include "engine/ops.h"
#include "kernels/stat_dtype.h"

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

// Runs of every document's first and second half within the local rows (c rows each). On CUDA
// also the same rows as device ids (first_ids, second_ids) and the second halves' entries of a
// flattened [Hq, T] statistic (stat_second_ids: h * T + row), uploaded once per ring call.
struct HalfRuns {
  std::vector<int64_t> first_starts, second_starts, halves, second_rows;
  Tensor first_ids, second_ids, stat_second_ids;
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

// Row ids as an [n] i64 tensor on `d`, checked here against `limit` (the CUDA kernels trust them).
Tensor device_ids(const std::vector<int64_t>& ids, int64_t limit, Device d) {
  for (int64_t i : ids)
    LT_CHECK(i >= 0 && i < limit, "ring attention: row id ", i, " outside [0, ", limit, ")");
  const int64_t n = static_cast<int64_t>(ids.size());
  Tensor out = Tensor::empty({n}, DType::kI64, d, MemTag::kWorkspace);
  if (n > 0) ops::copy(out, Tensor::from_vector(ids, {n}));
  return out;
}

void upload_ids(HalfRuns& h, int64_t T, int64_t H, Device d) {
  std::vector<int64_t> first;
  for (size_t i = 0; i < h.first_starts.size(); ++i)
    for (int64_t r = 0; r < h.halves[i]; ++r) first.push_back(h.first_starts[i] + r);
  std::vector<int64_t> stat;
  for (int64_t hh = 0; hh < H; ++hh)
    for (int64_t r : h.second_rows) stat.push_back(hh * T + r);
  h.first_ids = device_ids(first, T, d);
  h.second_ids = device_ids(h.second_rows, T, d);
  h.stat_second_ids = device_ids(stat, H * T, d);
}

// cu_seqlens for the attention blocks: host i32 on the CPU, uploaded once on CUDA (with the
// max_seqlen hints below, the CUDA attention then reads nothing back to the host).
Tensor cu_tensor(const std::vector<int32_t>& v, Device d) {
  Tensor t = i32_tensor(v);
  return d.is_cpu() ? t : t.to(d, DType::kI32, MemTag::kWorkspace);
}

// The local rows of every document's first (second) half: [Th, ...] from [T, ...].
Tensor take_half(const Tensor& src, const HalfRuns& h, bool second) {
  if (src.device().is_cpu())
    return gather_runs(src, second ? h.second_starts : h.first_starts, h.halves);
  Shape shape = src.shape();
  shape[0] = static_cast<int64_t>(h.second_rows.size());
  Tensor out = Tensor::empty(shape, src.dtype(), src.device(), MemTag::kWorkspace);
  ring_gather_cuda(src, second ? h.second_ids : h.first_ids, out);
  return out;
}

// The second halves' columns of an [H, T] statistic (lse) -> [H, Th].
Tensor take_second_cols(const Tensor& stat, const HalfRuns& h) {
  if (stat.device().is_cpu()) return gather_cols(stat, h.second_rows);
  const int64_t H = stat.size(0), n = static_cast<int64_t>(h.second_rows.size());
  Tensor out = Tensor::empty({H, n}, stat.dtype(), stat.device(), MemTag::kWorkspace);
  ring_gather_cuda(stat.view({stat.numel()}), h.stat_second_ids, out.view({H * n}));
  return out;
}

// dst's rows of every first (second) half += src [Th, ...]; dst may be wider than src (f32 on
// CUDA for 16-bit src).
void add_half(const Tensor& dst, const HalfRuns& h, bool second, const Tensor& src) {
  if (dst.device().is_cpu())
    add_runs(dst, second ? h.second_starts : h.first_starts, src, h.halves);
  else
    ring_add_rows_cuda(dst, second ? h.second_ids : h.first_ids, src);
}

void add_all(const Tensor& dst, const Tensor& src) {
  if (dst.device().is_cpu())
    add_runs(dst, {0}, src, {dst.size(0)});
  else
    ring_add_rows_cuda(dst, Tensor(), src);
}

// out/lse absorb a partial result whose row i is local row rows[i] (ids: the same on CUDA,
// undefined when the partial covers every row).
void merge_rows(const Tensor& out, const Tensor& lse, const Tensor& ob, const Tensor& lb,
                const std::vector<int64_t>& rows, const Tensor& ids) {
  if (out.device().is_cuda())
    ring_lse_merge_cuda(out, lse, ob, lb, ids);
  else if (out.dtype() == DType::kF32)
    merge<float>(out, lse, ob, lb, rows);
  else
    merge<double>(out, lse, ob, lb, rows);
}

void check_inputs(const char* op, Communicator& comm, const Tensor& q, const Tensor& k,
                  const Tensor& v, const ZigzagLayout& z) {
  LT_CHECK(comm.size() == z.cp && comm.rank() == z.rank, op, ": layout for ", z.rank, "/", z.cp,
           " on rank ", comm.rank(), "/", comm.size());
  const DType dt = q.dtype();
  const bool cpu = q.device().is_cpu();
  LT_CHECK(cpu ? dt == DType::kF32 || dt == DType::kF64 : dtype_is_floating(dt), op,
           ": CPU f32/f64 or CUDA f32/bf16/f16/f64, got ", q.str(),
           cpu ? " (the CPU attention takes no 16-bit input)" : "");
  LT_CHECK(
      k.device() == q.device() && v.device() == q.device() && k.dtype() == dt && v.dtype() == dt,
      op, ": q ", q.str(), ", k ", k.str(), ", v ", v.str(), " need one dtype and device");
  // MPI moves host tensors and NCCL device tensors: refuse the other pairing before any message.
  const std::string backend = comm.backend_name();
  LT_CHECK(z.cp == 1 || (cpu ? backend != "nccl" : backend != "mpi"), op, ": ", q.str(),
           " over the ", backend, " communicator (CUDA rings need nccl, CPU rings mpi)");
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

namespace {

// The three block shapes' attention options, with exact max_seqlen hints (the CUDA attention
// then needs no host copy of the cu_seqlens; the CPU attention ignores them).
struct BlockOptions {
  AttentionOptions causal, q_all_k_half, q_half_k_all;
};

BlockOptions block_options(const ZigzagLayout& z, double scale) {
  int64_t c = 0;
  for (size_t d = 0; d + 1 < z.cu_seqlens_half.size(); ++d)
    c = std::max<int64_t>(c, z.cu_seqlens_half[d + 1] - z.cu_seqlens_half[d]);
  BlockOptions o;
  o.causal.scale = scale;
  o.causal.max_seqlen_q = o.causal.max_seqlen_k = 2 * c;
  o.q_all_k_half = o.causal;
  o.q_all_k_half.causal = false;
  o.q_all_k_half.max_seqlen_k = c;
  o.q_half_k_all = o.q_all_k_half;
  o.q_half_k_all.max_seqlen_q = c;
  o.q_half_k_all.max_seqlen_k = 2 * c;
  return o;
}

}  // namespace

AttentionOutput zigzag_ring_attention_fwd(Communicator& comm, const Tensor& q_in, const Tensor& k,
                                          const Tensor& v, const ZigzagLayout& z, double scale) {
  check_inputs("zigzag_ring_attention_fwd", comm, q_in, k, v, z);
  const Tensor q = q_in.contiguous();
  const int64_t T = q.size(0), Hq = q.size(1);
  const Device dev = q.device();
  const DType acc = stat_dtype(q.dtype());
  const Tensor cu_local = cu_tensor(z.cu_seqlens_local, dev);
  const Tensor cu_half = cu_tensor(z.cu_seqlens_half, dev);
  const BlockOptions opt = block_options(z, scale);

  AttentionOutput res{Tensor::empty(q.shape(), q.dtype(), dev), Tensor::empty({Hq, T}, acc, dev)};
  if (z.cp == 1) {
    attention_fwd(q, k, v, cu_local, cu_local, opt.causal, res.out, res.lse);
    return res;
  }
  HalfRuns hr = half_runs(z);
  if (dev.is_cuda()) upload_ids(hr, T, Hq, dev);
  std::vector<int64_t> all_rows(T);
  for (int64_t i = 0; i < T; ++i) all_rows[i] = i;
  const Tensor q_second = take_half(q, hr, true);
  const int64_t Th = q_second.size(0);
  // The running out in the accumulation dtype: res.out itself for f32/f64 input; for 16-bit input
  // an f32 buffer, rounded into res.out once after the last step.
  const bool narrow = q.dtype() != acc;
  const Tensor out_acc = narrow ? Tensor::empty(q.shape(), acc, dev, MemTag::kWorkspace) : res.out;

  // The KV ring: [2, T, Hk, D] (k then v), sent to rank+1, received from rank-1 into the second
  // buffer. Step s posts the exchange of the KV it computes on before computing, so the transfer
  // runs while it computes (NCCL: on the communicator's stream, which waited for this stream at
  // group_start; MPI: nonblocking calls completed at group_end).
  Shape kv_shape = {2, k.size(0), k.size(1), k.size(2)};
  Tensor kv = Tensor::empty(kv_shape, k.dtype(), dev, MemTag::kComm);
  kv.select(0, 0).copy_(k);
  kv.select(0, 1).copy_(v);
  Tensor next = Tensor::empty(kv_shape, k.dtype(), dev, MemTag::kComm);
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
      attention_fwd(q, ks, vs, cu_local, cu_local, opt.causal, res.out, res.lse);
      if (narrow) ops::copy(out_acc, res.out);
    } else if (j < r) {
      const Tensor kh = take_half(ks, hr, false);
      const Tensor vh = take_half(vs, hr, false);
      Tensor ob = Tensor::empty(q.shape(), q.dtype(), dev, MemTag::kWorkspace);
      Tensor lb = Tensor::empty({Hq, T}, acc, dev, MemTag::kWorkspace);
      attention_fwd(q, kh, vh, cu_local, cu_half, opt.q_all_k_half, ob, lb);
      merge_rows(out_acc, res.lse, ob, lb, all_rows, Tensor());
    } else {
      Tensor ob = Tensor::empty(q_second.shape(), q.dtype(), dev, MemTag::kWorkspace);
      Tensor lb = Tensor::empty({Hq, Th}, acc, dev, MemTag::kWorkspace);
      attention_fwd(q_second, ks, vs, cu_half, cu_local, opt.q_half_k_all, ob, lb);
      merge_rows(out_acc, res.lse, ob, lb, hr.second_rows, hr.second_ids);
    }
    if (more) {
      comm.group_end();
      std::swap(kv, next);
    }
  }
  if (narrow) ops::copy(res.out, out_acc);
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
  const Device dev = q.device();
  const DType dt = q.dtype(), acc = stat_dtype(dt);
  LT_CHECK(out.shape() == q.shape() && dout.shape() == q.shape() && out.dtype() == dt &&
               dout.dtype() == dt && lse.shape() == (Shape{Hq, T}) && lse.dtype() == acc &&
               out.device() == dev && dout.device() == dev && lse.device() == dev,
           "zigzag_ring_attention_bwd: out ", out.str(), ", lse ", lse.str(), ", dout ", dout.str(),
           " for q ", q.str());
  const Tensor cu_local = cu_tensor(z.cu_seqlens_local, dev);
  const Tensor cu_half = cu_tensor(z.cu_seqlens_half, dev);
  const BlockOptions opt = block_options(z, scale);

  AttentionGrads g;
  g.dq = Tensor::empty(q.shape(), dt, dev);
  if (z.cp == 1) {
    g.dk = Tensor::empty(k.shape(), dt, dev);
    g.dv = Tensor::empty(v.shape(), dt, dev);
    attention_bwd(dout, q, k, v, out, lse, cu_local, cu_local, opt.causal, g.dq, g.dk, g.dv);
    return g;
  }
  HalfRuns hr = half_runs(z);
  if (dev.is_cuda()) upload_ids(hr, T, Hq, dev);
  const Tensor q_second = take_half(q, hr, true);
  const Tensor out_second = take_half(out, hr, true);
  const Tensor dout_second = take_half(dout, hr, true);
  const Tensor lse_second = take_second_cols(lse, hr);
  const int64_t Th = q_second.size(0);
  const Shape kh_shape = {Th, k.size(1), k.size(2)};
  // dQ accumulates in the accumulation dtype: g.dq itself for f32/f64 input, else an f32 buffer
  // rounded into g.dq at the end. Block gradients come in q's dtype (the attention's contract).
  const bool narrow = dt != acc;
  const Tensor dq_acc = narrow ? Tensor::empty(q.shape(), acc, dev, MemTag::kWorkspace) : g.dq;

  // Two rings, both to rank+1 from rank-1: the KV (cp-1 hops, as in the forward) and the dK/dV
  // accumulator (f32/f64) of the KV this rank held one step earlier (cp hops). At step s the
  // partial dK/dV of KV_j (contributions of ranks j..r-1) arrives while this rank computes its
  // own contribution; the sum goes on at step s+1, and the last hop brings every rank the
  // complete dK/dV of its own KV.
  const Shape kv_shape = {2, k.size(0), k.size(1), k.size(2)};
  Tensor kv = Tensor::empty(kv_shape, k.dtype(), dev, MemTag::kComm);
  kv.select(0, 0).copy_(k);
  kv.select(0, 1).copy_(v);
  Tensor kv_next = Tensor::empty(kv_shape, k.dtype(), dev, MemTag::kComm);
  Tensor dkv = Tensor::empty(kv_shape, acc, dev, MemTag::kComm);
  Tensor dkv_in = Tensor::empty(kv_shape, acc, dev, MemTag::kComm);
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
      // Nothing is in flight on dkv yet: step 0 writes dq and the first dK/dV directly (through
      // q-dtype buffers widened into the accumulators for 16-bit input).
      if (!narrow) {
        attention_bwd(dout, q, ks, vs, out, lse, cu_local, cu_local, opt.causal, g.dq,
                      dkv.select(0, 0), dkv.select(0, 1));
      } else {
        const Tensor dk0 = Tensor::empty(k.shape(), dt, dev, MemTag::kWorkspace);
        const Tensor dv0 = Tensor::empty(v.shape(), dt, dev, MemTag::kWorkspace);
        attention_bwd(dout, q, ks, vs, out, lse, cu_local, cu_local, opt.causal, g.dq, dk0, dv0);
        ops::copy(dq_acc, g.dq);
        ops::copy(dkv.select(0, 0), dk0);
        ops::copy(dkv.select(0, 1), dv0);
      }
    } else if (j < r) {
      const Tensor kh = take_half(ks, hr, false);
      const Tensor vh = take_half(vs, hr, false);
      dq_b = Tensor::empty(q.shape(), dt, dev, MemTag::kWorkspace);
      dk_b = Tensor::empty(kh_shape, dt, dev, MemTag::kWorkspace);
      dv_b = Tensor::empty(kh_shape, dt, dev, MemTag::kWorkspace);
      attention_bwd(dout, q, kh, vh, out, lse, cu_local, cu_half, opt.q_all_k_half, dq_b, dk_b,
                    dv_b);
    } else {
      dq_b = Tensor::empty(q_second.shape(), dt, dev, MemTag::kWorkspace);
      dk_b = Tensor::empty(k.shape(), dt, dev, MemTag::kWorkspace);
      dv_b = Tensor::empty(v.shape(), dt, dev, MemTag::kWorkspace);
      attention_bwd(dout_second, q_second, ks, vs, out_second, lse_second, cu_half, cu_local,
                    opt.q_half_k_all, dq_b, dk_b, dv_b);
    }
    comm.group_end();
    if (s > 0) {
      // dkv_in (the partial for KV_j) + this rank's contribution becomes the next dkv to send.
      if (j < r) {
        add_all(dq_acc, dq_b);
        add_half(dkv_in.select(0, 0), hr, false, dk_b);
        add_half(dkv_in.select(0, 1), hr, false, dv_b);
      } else {
        add_half(dq_acc, hr, true, dq_b);
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
  if (!narrow) {
    g.dk = dkv_in.select(0, 0);
    g.dv = dkv_in.select(0, 1);
    return g;
  }
  g.dk = Tensor::empty(k.shape(), dt, dev);
  g.dv = Tensor::empty(v.shape(), dt, dev);
  ops::copy(g.dq, dq_acc);
  ops::copy(g.dk, dkv_in.select(0, 0));
  ops::copy(g.dv, dkv_in.select(0, 1));
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
    Tensor dout =
        grads[0].defined() ? grads[0] : Tensor::zeros(qs.shape(), qs.dtype(), qs.device());
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
