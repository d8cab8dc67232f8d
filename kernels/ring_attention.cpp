// Zigzag layout and the CPU forward of zigzag ring attention (see ring_attention.h). Scratch:
// the KV ring's two buffers [2,T,Hk,D] and the gathered half blocks, tagged kComm/kActivation.
#include "kernels/ring_attention.h"

#include <cmath>
#include <cstring>

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

AttentionOutput zigzag_ring_attention_fwd(Communicator& comm, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const ZigzagLayout& z, double scale) {
  LT_CHECK(comm.size() == z.cp && comm.rank() == z.rank, "zigzag_ring_attention_fwd: layout for ",
           z.rank, "/", z.cp, " on rank ", comm.rank(), "/", comm.size());
  LT_CHECK(q.device().is_cpu() && (q.dtype() == DType::kF32 || q.dtype() == DType::kF64),
           "zigzag_ring_attention_fwd: CPU f32/f64, got ", q.str());
  LT_CHECK(q.size(0) == z.local_rows() && k.size(0) == z.local_rows(),
           "zigzag_ring_attention_fwd: q ", q.str(), " for ", z.local_rows(), " local rows");
  const int64_t T = q.size(0);
  const DType acc = q.dtype();
  Tensor cu_local = i32_tensor(z.cu_seqlens_local);
  Tensor cu_half = i32_tensor(z.cu_seqlens_half);
  AttentionOptions causal;
  causal.scale = scale;
  AttentionOptions full = causal;
  full.causal = false;

  AttentionOutput res{Tensor::empty(q.shape(), q.dtype(), Device::cpu(), MemTag::kActivation),
                      Tensor::empty({q.size(1), T}, acc, Device::cpu(), MemTag::kActivation)};
  attention_fwd(q, k, v, cu_local, cu_local, causal, res.out, res.lse);
  if (z.cp == 1) return res;

  // Runs of first and second halves of every document (local rows).
  std::vector<int64_t> first_starts, second_starts, halves, second_rows, all_rows(T);
  for (size_t d = 0; d + 1 < z.cu_seqlens_local.size(); ++d) {
    const int64_t c = z.cu_seqlens_half[d + 1] - z.cu_seqlens_half[d];
    first_starts.push_back(z.cu_seqlens_local[d]);
    second_starts.push_back(z.cu_seqlens_local[d] + c);
    halves.push_back(c);
    for (int64_t i = 0; i < c; ++i) second_rows.push_back(z.cu_seqlens_local[d] + c + i);
  }
  for (int64_t i = 0; i < T; ++i) all_rows[i] = i;
  Tensor q_second = gather_runs(q, second_starts, halves);

  // The KV ring: [2, T, Hk, D] (k then v), sent to rank+1, received from rank-1.
  Shape kv_shape = {2, k.size(0), k.size(1), k.size(2)};
  Tensor kv = Tensor::empty(kv_shape, k.dtype(), Device::cpu(), MemTag::kComm);
  kv.select(0, 0).copy_(k);
  kv.select(0, 1).copy_(v);
  Tensor next = Tensor::empty(kv_shape, k.dtype(), Device::cpu(), MemTag::kComm);
  const int r = z.rank, cp = z.cp;
  for (int s = 1; s < cp; ++s) {
    comm.group_start();
    comm.send(kv, (r + 1) % cp);
    comm.recv(next, (r + cp - 1) % cp);
    comm.group_end();
    std::swap(kv, next);
    const int j = (r - s + cp) % cp;
    Tensor ks = kv.select(0, 0), vs = kv.select(0, 1);
    if (j < r) {
      Tensor kh = gather_runs(ks, first_starts, halves), vh = gather_runs(vs, first_starts, halves);
      Tensor ob = Tensor::empty(q.shape(), q.dtype(), Device::cpu(), MemTag::kActivation);
      Tensor lb = Tensor::empty({q.size(1), T}, acc, Device::cpu(), MemTag::kActivation);
      attention_fwd(q, kh, vh, cu_local, cu_half, full, ob, lb);
      if (acc == DType::kF32)
        merge<float>(res.out, res.lse, ob, lb, all_rows);
      else
        merge<double>(res.out, res.lse, ob, lb, all_rows);
    } else {
      const int64_t Th = q_second.size(0);
      Tensor ob = Tensor::empty(q_second.shape(), q.dtype(), Device::cpu(), MemTag::kActivation);
      Tensor lb = Tensor::empty({q.size(1), Th}, acc, Device::cpu(), MemTag::kActivation);
      attention_fwd(q_second, ks.contiguous(), vs.contiguous(), cu_half, cu_local, full, ob, lb);
      if (acc == DType::kF32)
        merge<float>(res.out, res.lse, ob, lb, second_rows);
      else
        merge<double>(res.out, res.lse, ob, lb, second_rows);
    }
  }
  return res;
}

}  // namespace leantune::kernels
