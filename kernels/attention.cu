// attention on CUDA: causal (bottom-right), grouped-query, variable-length scaled dot-product
// attention, forward and backward (kernels/attention.h holds the contract).
//   q:[Tq,Hq,D], k/v:[Tk,Hk,D] (rows may be strided: heads and head_dim dense), one float dtype;
//   cu_seqlens_q/k:[B+1] i32|i64 on the host or the device -> out:[Tq,Hq,D] contiguous,
//   lse:[Hq,Tq] f32 (f64 for f64). Query i of a sequence (Lq queries, Lk keys) sees keys
//   j <= i + Lk - Lq when causal; a row that sees no key gets out = 0, lse = -inf, zero grads.
//   Rows before cu[0] (a device cu_seqlens is not validated) or beyond cu[B] belong to no
//   sequence: out = 0, lse = -inf, dq = dk = dv = 0 (kernels/attention_rows.h).
//
// Two implementations behind one entry point:
//
// 1. Tensor-core flash attention (bf16/f16, head_dim 64 or 128, sm_80+): mma.sync m16n8k16 with
//    f32 accumulation, ldmatrix from shared tiles whose rows are padded by 16 bytes (conflict-free
//    ldmatrix, cp.async and 4-byte stores; every address a per-lane offset plus an immediate),
//    cp.async double buffering of the streamed operand.
//    Forward (FA2): one CTA = one (sequence, q head, block of kBr=128 queries), 4 warps of 32
//    query rows; it streams blocks of kBc keys (64 at D=64, 32 at D=128) of K/V from the last
//    visible block down (the masked diagonal blocks first), online softmax in the log2 domain
//    (x = s*scale*log2 e, p = 2^(x - m)), P rounded to the input dtype for P V, O and the row
//    sums in f32 registers. Rows whose running max is still -inf subtract 0 instead (no
//    -inf - -inf = NaN). Output: O / l (0 when l = 0), lse = (m + log2 l) ln 2 (-inf when l = 0).
//    Backward (FA2, KV-block parallel): a preprocess kernel forms Dsum = rowsum(dO * O) and
//    lse2 = lse * log2 e (+inf for -inf rows, so that P = 0 there) in f32 and zeroes an f32 dQ
//    accumulator. One CTA = one (sequence, KV head, block of kBc=128 keys), 8 warps of 16 keys;
//    it loops over the query heads of the GQA group and the query blocks (kBr = 64 at D=64, 32
//    at D=128) that see its keys, with K, V in shared memory and dK, dV in f32 registers, and
//    per query block computes S^T = K Q^T, P^T = 2^(S^T scale log2 e - lse2), dP^T = V dO^T,
//    dS^T = P^T (dP^T - Dsum), dV += P^T dO, dK += dS^T Q (so dK/dV of a KV head are summed
//    over its group inside one CTA: exact and deterministic), and dQ += dS K through dS^T
//    staged in shared memory, added with f32 atomics into the accumulator (the one
//    non-deterministic summation order, as in FA2). A postprocess converts dQ * scale to the
//    input dtype; dK gets the scale at the end.
//    Scheduling: grid = (B*H, 1, ranks); blockIdx.z is a rank, heaviest block first (forward:
//    the last query block of every sequence; backward: the first key block), so the hardware's
//    in-order dispatch approximates longest-processing-time-first for causal masks; CTAs loop
//    over ranks with stride gridDim.z, so a too-small max_seqlen hint costs time, not results.
//    Registers (ptxas, sm_90): forward 251 (D=128) / 233 (D=64), backward 251 / 223, no spills.
//    Shared memory (row = 2 D + 16 bytes): forward (kBr + 4 kBc) rows = 68 KiB at D=128, 54 KiB
//    at D=64; backward (2 kBc + 4 kBr) rows + kBc (2 kBr + 16) + 16 kBr bytes = 112.5 KiB at
//    D=128, 91 KiB at D=64.
//    Scratch (kWorkspace): backward Dsum and lse2 ([Hq,Tq] f32 each) and dQ accumulator
//    ([Tq,Hq,D] f32).
// 2. A simple kernel (f32, f64, other head dims up to 512, pre-sm_80 devices): one warp per
//    (row, head), keys visited one at a time with an online softmax; backward one warp per query
//    row (dQ) and one per key row (dK, dV summed over the group): deterministic, no atomics,
//    O(L^2 D) scalar work. Meant for tests and small shapes.
//
// cu_seqlens are used as i32 on the device (a host or i64 tensor is converted; a device i32
// tensor is used as is, with no synchronisation when max_seqlen hints are given). Host
// cu_seqlens are validated like the CPU path; device ones are clamped into [0, T] so that a bad
// tensor cannot cause an out-of-bounds access. Inputs whose rows are not 16-byte aligned are
// copied (kWorkspace) for the tensor-core path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "engine/cuda_utils.cuh"
#include "kernels/attention.h"
#include "kernels/attention_rows.h"

namespace leantune::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------- sequences

struct SeqBounds {
  int q0, lq, k0, lk;
};

// Sequence b's row ranges, clamped into the tensors (a malformed device cu_seqlens gives wrong
// results, never an out-of-bounds access).
__device__ __forceinline__ SeqBounds seq_bounds(const int* cu_q, const int* cu_k, int b, int tq,
                                                int tk) {
  const int q0 = min(max(cu_q[b], 0), tq);
  const int q1 = min(max(cu_q[b + 1], q0), tq);
  const int k0 = min(max(cu_k[b], 0), tk);
  const int k1 = min(max(cu_k[b + 1], k0), tk);
  return {q0, q1 - q0, k0, k1 - k0};
}

// The sequence that owns `row` (the last b with cu[b] <= row < cu[b+1]), or -1.
__device__ __forceinline__ int seq_of_row(const int* cu, int batch, int row) {
  if (batch <= 0 || row < cu[0] || row >= cu[batch]) return -1;
  int lo = 0, hi = batch;  // cu[lo] <= row < cu[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (cu[mid] <= row)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// ---------------------------------------------------------------- tensor-core primitives

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared tiles hold rows of 16-bit values padded by 16 bytes: the 8 row addresses of one
// ldmatrix (or 8 rows of 4-byte stores) then fall in 8 different 4-bank groups, so accesses are
// conflict-free, and every address is a per-lane offset plus a compile-time one.
constexpr int padded_row_bytes(int elems) { return elems * 2 + 16; }

// Per-lane byte offsets into a tile with rows of `rb` bytes for the four ldmatrix.x4 patterns.
// Add (row0 * rb + col0 * 2) for the 16x16 block at (row0, col0).
//   a_off:  A fragment of a row-major [m][k] tile (matrices: rows 0-7/8-15 x k 0-7, then k 8-15)
//   b_off:  B fragment of a tile stored [n][k] (two n8 tiles: r0,r1 for n 0-7, r2,r3 for n 8-15);
//           also the A fragment, with .trans, of a tile stored [k][m] (dS from dS^T)
//   bt_off: B fragment, with .trans, of a tile stored [k][n] (r0,r1 for n 0-7, r2,r3 for n 8-15)
__device__ __forceinline__ uint32_t a_off(int lane, int rb) {
  return static_cast<uint32_t>((lane & 15) * rb + ((lane >> 4) << 4));
}
__device__ __forceinline__ uint32_t b_off(int lane, int rb) {
  return static_cast<uint32_t>(((lane & 7) + ((lane >> 4) << 3)) * rb + (((lane >> 3) & 1) << 4));
}
__device__ __forceinline__ uint32_t bt_off(int lane, int rb) {
  return static_cast<uint32_t>(((lane & 7) + (((lane >> 3) & 1) << 3)) * rb + ((lane >> 4) << 4));
}

// 16 bytes global -> shared, bypassing L1; ok == false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool ok) {
  const int n = ok ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c[16x8] += a[16x16] b[16x8], f32 accumulators. Fragments (g = lane/4, t = lane%4):
//   a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)   [row, k]
//   b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)                             [row, n]
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "mma_16816: bf16 or f16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, lo in the low half (the element with the smaller column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// A fragment of a 16x16 operand held as the f32 accumulators of two n8 tiles (s0: columns
// 0..7, s1: columns 8..15), rounded to T: the P (or dS) of one k16 step.
template <typename T>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&s0)[4],
                                         const float (&s1)[4]) {
  a[0] = pack2<T>(s0[0], s0[1]);
  a[1] = pack2<T>(s0[2], s0[3]);
  a[2] = pack2<T>(s1[0], s1[1]);
  a[3] = pack2<T>(s1[2], s1[3]);
}

// Rows [0, valid) of a kRows x kD tile at g (row stride `stride` elements) into the padded
// shared tile at s_base; rows >= valid are zero-filled (so masked keys and padding rows carry
// zeros, never stale data, into the products). `safe` is any valid global address.
template <typename T, int kRows, int kD, int kThreads>
__device__ __forceinline__ void tile_load_async(uint32_t s_base, const T* g, int64_t stride,
                                                int valid, const T* safe, int tid) {
  constexpr int kChunks = kD / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowsPerPass == 0,
                "tile_load_async: tile not a multiple of the block");
  // One running pointer per thread (precomputing every pass's address costs registers).
  const int r0 = tid / kChunks, c = tid % kChunks;
  const T* src = g + static_cast<int64_t>(r0) * stride + c * 8;
  const int64_t step = static_cast<int64_t>(kRowsPerPass) * stride;
  const uint32_t dst = s_base + static_cast<uint32_t>(r0 * padded_row_bytes(kD) + c * 16);
#pragma unroll
  for (int it = 0; it < kRows / kRowsPerPass; ++it) {
    const bool ok = r0 + it * kRowsPerPass < valid;
    cp_async_16(dst + it * kRowsPerPass * padded_row_bytes(kD), ok ? src : safe, ok);
    src += step;
  }
}

// ---------------------------------------------------------------- tensor-core forward

// Each warp owns kMT = 2 m16 row tiles (32 query rows): with K/V fragments shared by both, the
// shared-memory traffic per MMA is half that of 16-row warps. kBc is 32 at D=128 so that O
// (128 f32), S (32) and the fragments fit in 255 registers without spilling (ptxas: 251).
template <int D>
struct FwdCfg {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBr = 128;                  // queries per CTA
  static constexpr int kBc = D >= 128 ? 32 : 64;   // keys per step
  static constexpr int kMT = kBr / (16 * kWarps);  // m16 tiles per warp
  static constexpr int kNT = kBc / 8;              // n8 tiles of S
  static constexpr int kDT = D / 8;                // n8 tiles of O
  static constexpr int kRowBytes = padded_row_bytes(D);
  static constexpr int kQBytes = kBr * kRowBytes;
  static constexpr int kKVBytes = kBc * kRowBytes;
  static constexpr int kSmem = kQBytes + 4 * kKVBytes;
  static_assert(D % 16 == 0 && kBc % 16 == 0 && kBr % (16 * kWarps) == 0, "tile shapes");
};

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  int64_t q_stride, k_stride, v_stride, o_stride;  // elements between rows
  const int* cu_q;
  const int* cu_k;
  int tq, tk, hq, hk, group, batch;
  float scale_log2;
  bool causal;
};

template <typename T, int D>
__device__ __forceinline__ void fwd_tile(const FwdParams& p, const SeqBounds& s, int h, int m,
                                         unsigned char* smem) {
  using C = FwdCfg<D>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int i0 = m * C::kBr;
  const int rows = min(C::kBr, s.lq - i0);
  const int shift = s.lk - s.lq;  // query i sees keys j <= i + shift
  const int kend = p.causal ? min(s.lk, i0 + rows + shift) : s.lk;
  const int nkb = kend > 0 ? (kend + C::kBc - 1) / C::kBc : 0;
  const int hk = h / p.group;

  const T* qbase = static_cast<const T*>(p.q);
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  const T* qg = qbase + static_cast<int64_t>(s.q0 + i0) * p.q_stride + h * D;
  const T* kg = kbase + static_cast<int64_t>(s.k0) * p.k_stride + hk * D;
  const T* vg = vbase + static_cast<int64_t>(s.k0) * p.v_stride + hk * D;

  const uint32_t q_s = smem_u32(smem);
  const uint32_t kv_s = q_s + C::kQBytes;  // K0, V0, K1, V1
  auto k_buf = [&](int buf) { return kv_s + buf * 2 * C::kKVBytes; };
  auto v_buf = [&](int buf) { return kv_s + buf * 2 * C::kKVBytes + C::kKVBytes; };
  auto load_kv = [&](int n, int buf) {
    const int j0 = n * C::kBc;
    tile_load_async<T, C::kBc, D, C::kThreads>(
        k_buf(buf), kg + static_cast<int64_t>(j0) * p.k_stride, p.k_stride, s.lk - j0, kbase, tid);
    tile_load_async<T, C::kBc, D, C::kThreads>(
        v_buf(buf), vg + static_cast<int64_t>(j0) * p.v_stride, p.v_stride, s.lk - j0, vbase, tid);
  };

  if (nkb > 0) {
    tile_load_async<T, C::kBr, D, C::kThreads>(q_s, qg, p.q_stride, rows, qbase, tid);
    load_kv(nkb - 1, 0);
    cp_async_commit();
  }

  float o[C::kMT][C::kDT][4];
  float row_max[C::kMT][2], row_sum[C::kMT][2];
#pragma unroll
  for (int mt = 0; mt < C::kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < C::kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = -INFINITY;
      row_sum[mt][r] = 0.f;
    }
  }
  const int warp_row0 = warp * C::kMT * 16;  // first tile row of this warp
  const uint32_t qa = q_s + warp_row0 * C::kRowBytes + a_off(lane, C::kRowBytes);
  const uint32_t kb_lane = b_off(lane, C::kRowBytes), vb_lane = bt_off(lane, C::kRowBytes);

  for (int it = 0; it < nkb; ++it) {
    const int n = nkb - 1 - it;
    const int buf = it & 1;
    cp_async_wait_all();
    // The data of step `it` is visible to all; every warp has finished step it-1, so its
    // buffers may be refilled.
    __syncthreads();
    if (it + 1 < nkb) {
      load_kv(n - 1, buf ^ 1);
      cp_async_commit();
    }

    const uint32_t kb = k_buf(buf) + kb_lane, vb = v_buf(buf) + vb_lane;
    // S = Q K^T (kMT x kNT tiles of 16x8 per warp).
    float sacc[C::kMT][C::kNT][4];
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[C::kMT][4];
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt) ldmatrix_x4(a[mt], qa + mt * 16 * C::kRowBytes + ks * 32);
#pragma unroll
      for (int np = 0; np < C::kNT / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, kb + np * 16 * C::kRowBytes + ks * 32);
#pragma unroll
        for (int mt = 0; mt < C::kMT; ++mt) {
          mma_16816<T>(sacc[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816<T>(sacc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Scale into the log2 domain; mask keys beyond the sequence and above the diagonal.
    const int j0 = n * C::kBc;
    const bool need_mask = j0 + C::kBc > s.lk || (p.causal && j0 + C::kBc - 1 > i0 + shift);
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sacc[mt][nt][e] * p.scale_log2;
          if (need_mask) {
            const int i = i0 + warp_row0 + mt * 16 + (lane >> 2) + ((e >> 1) << 3);
            const int j = j0 + nt * 8 + ((lane & 3) << 1) + (e & 1);
            if (j >= s.lk || (p.causal && j > i + shift)) x = -INFINITY;
          }
          sacc[mt][nt][e] = x;
        }

        // Online softmax. A row is spread over the 4 lanes of a quad (t = lane % 4).
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt)
          mx = fmaxf(mx, fmaxf(sacc[mt][nt][2 * r], sacc[mt][nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with no visible key so far keeps max -inf: subtract 0 (every p is then 0).
        const float m_use = mx == -INFINITY ? 0.f : mx;
        const float alpha = exp2f(row_max[mt][r] - m_use);
        row_max[mt][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt) {
          const float p0 = exp2f(sacc[mt][nt][2 * r] - m_use);
          const float p1 = exp2f(sacc[mt][nt][2 * r + 1] - m_use);
          sacc[mt][nt][2 * r] = p0;
          sacc[mt][nt][2 * r + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < C::kDT; ++dt) {
          o[mt][dt][2 * r] *= alpha;
          o[mt][dt][2 * r + 1] *= alpha;
        }
      }

      // O += P V, P rounded to T as the A operand straight from the accumulators.
#pragma unroll
    for (int kk = 0; kk < C::kBc / 16; ++kk) {
      uint32_t a[C::kMT][4];
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt)
        acc_to_a<T>(a[mt], sacc[mt][2 * kk], sacc[mt][2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < C::kDT / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vb + kk * 16 * C::kRowBytes + dp * 32);
#pragma unroll
        for (int mt = 0; mt < C::kMT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], a[mt], b[0], b[1]);
          mma_16816<T>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // Epilogue: O / l and lse for the rows that exist.
  T* obase = static_cast<T*>(p.out);
#pragma unroll
  for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float mx = row_max[mt][r];
      const bool empty = !(sum > 0.f) || mx == -INFINITY;
      const float inv = empty ? 0.f : 1.f / sum;
      const int i = i0 + warp_row0 + mt * 16 + (lane >> 2) + r * 8;
      if (i < s.lq) {
        T* orow = obase + static_cast<int64_t>(s.q0 + i) * p.o_stride + h * D;
#pragma unroll
        for (int dt = 0; dt < C::kDT; ++dt)
          *reinterpret_cast<uint32_t*>(orow + dt * 8 + ((lane & 3) << 1)) =
              pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
        if ((lane & 3) == 0)
          p.lse[static_cast<int64_t>(h) * p.tq + s.q0 + i] =
              empty ? -INFINITY : (mx + log2f(sum)) * kLn2;
      }
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(FwdCfg<D>::kThreads) attention_fwd_mma_kernel(const FwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int h = blockIdx.x % p.hq, b = blockIdx.x / p.hq;
  const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
  const int nblocks = (s.lq + FwdCfg<D>::kBr - 1) / FwdCfg<D>::kBr;
  for (int rank = blockIdx.z; rank < nblocks; rank += gridDim.z) {
    // Heaviest first: with a causal mask the last query block sees the most keys.
    const int m = p.causal ? nblocks - 1 - rank : rank;
    fwd_tile<T, D>(p, s, h, m, smem);
    __syncthreads();  // the next tile reuses shared memory
  }
}

// ---------------------------------------------------------------- tensor-core backward

template <int D>
struct BwdCfg {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBc = 16 * kWarps;  // keys per CTA (16 per warp)
  // Queries per step: 32 at D=128 keeps dK, dV (128 f32), S^T and dP^T within 255 registers.
  static constexpr int kBr = D >= 128 ? 32 : 64;
  static constexpr int kNT = kBr / 8;  // n8 tiles of S^T per warp
  static constexpr int kDT = D / 8;    // n8 tiles of dK, dV per warp
  static constexpr int kRowBytes = padded_row_bytes(D);
  static constexpr int kKBytes = kBc * kRowBytes;
  static constexpr int kQBytes = kBr * kRowBytes;
  static constexpr int kDsRowBytes = padded_row_bytes(kBr);
  static constexpr int kDsBytes = kBc * kDsRowBytes;  // dS^T [kBc][kBr]
  // dQ = dS K over the CTA: warps tile the kBr x D block as 4 row groups x 2 column groups.
  static constexpr int kDqRowGroups = kBr / 16;
  static constexpr int kDqColGroups = kWarps / kDqRowGroups;
  static constexpr int kDqCols = D / kDqColGroups;
  static constexpr int kDqNT = kDqCols / 8;
  // K, V, Q[2], dO[2], dS^T, lse2[2], Dsum[2].
  static constexpr int kSmem = 2 * kKBytes + 4 * kQBytes + kDsBytes + 4 * kBr * 4;
  static_assert(kDqRowGroups * kDqColGroups == kWarps && kDqCols % 16 == 0, "dQ warp tiling");
};

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse2;  // [Hq, Tq]: lse * log2 e, +inf for rows that see nothing
  const float* dsum;  // [Hq, Tq]: rowsum(dO * O)
  float* dq_acc;      // [Tq, Hq, D]
  void* dk;           // [Tk, Hk, D] contiguous
  void* dv;
  int64_t q_stride, k_stride, v_stride, do_stride;
  const int* cu_q;
  const int* cu_k;
  int tq, tk, hq, hk, group, batch;
  float scale, scale_log2;
  bool causal;
};

template <typename T, int D>
__device__ __forceinline__ void bwd_tile(const BwdParams& p, const SeqBounds& s, int hk, int n,
                                         unsigned char* smem) {
  using C = BwdCfg<D>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int j0 = n * C::kBc;
  const int shift = s.lk - s.lq;
  // Query blocks that see at least one key of this block.
  const int m_start = p.causal ? max(0, j0 - shift) / C::kBr : 0;
  const int m_end = (s.lq + C::kBr - 1) / C::kBr;
  const int nm = max(0, m_end - m_start);
  const int total = nm * p.group;

  const T* qbase = static_cast<const T*>(p.q);
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  const T* dobase = static_cast<const T*>(p.dout);

  const uint32_t k_s = smem_u32(smem);
  const uint32_t v_s = k_s + C::kKBytes;
  const uint32_t q_s0 = v_s + C::kKBytes;  // Q0, Q1, dO0, dO1
  auto q_buf = [&](int buf) { return q_s0 + buf * C::kQBytes; };
  auto do_buf = [&](int buf) { return q_s0 + (2 + buf) * C::kQBytes; };
  const uint32_t ds_s = q_s0 + 4 * C::kQBytes;
  unsigned char* ds_ptr = smem + (ds_s - k_s);
  float* lse_s = reinterpret_cast<float*>(smem + (ds_s - k_s) + C::kDsBytes);  // [2][kBr]
  float* dsum_s = lse_s + 2 * C::kBr;                                          // [2][kBr]

  // Iteration `it` covers query head hk*group + it / nm and query block m_start + it % nm.
  auto head_of = [&](int it) { return hk * p.group + it / nm; };
  auto block_of = [&](int it) { return m_start + it % nm; };
  auto load_q = [&](int it, int buf) {
    const int h = head_of(it), i0 = block_of(it) * C::kBr;
    const int64_t row = s.q0 + i0;
    tile_load_async<T, C::kBr, D, C::kThreads>(q_buf(buf), qbase + row * p.q_stride + h * D,
                                               p.q_stride, s.lq - i0, qbase, tid);
    tile_load_async<T, C::kBr, D, C::kThreads>(do_buf(buf), dobase + row * p.do_stride + h * D,
                                               p.do_stride, s.lq - i0, dobase, tid);
  };
  // Row statistics of iteration `it` for row tid (< kBr): plain loads (the per-sequence offsets
  // break 16-byte alignment), stored to shared memory after the step's compute has hidden the
  // latency.
  auto load_stats = [&](int it, float* l2, float* ds) {
    const int h = head_of(it), i = block_of(it) * C::kBr + tid;
    if (i < s.lq) {
      const int64_t idx = static_cast<int64_t>(h) * p.tq + s.q0 + i;
      *l2 = p.lse2[idx];
      *ds = p.dsum[idx];
    } else {
      *l2 = INFINITY;
      *ds = 0.f;
    }
  };

  float dk[C::kDT][4], dv[C::kDT][4];
#pragma unroll
  for (int dt = 0; dt < C::kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dk[dt][e] = 0.f;
      dv[dt][e] = 0.f;
    }

  if (total > 0) {
    const T* kg = kbase + static_cast<int64_t>(s.k0 + j0) * p.k_stride + hk * D;
    const T* vg = vbase + static_cast<int64_t>(s.k0 + j0) * p.v_stride + hk * D;
    tile_load_async<T, C::kBc, D, C::kThreads>(k_s, kg, p.k_stride, s.lk - j0, kbase, tid);
    tile_load_async<T, C::kBc, D, C::kThreads>(v_s, vg, p.v_stride, s.lk - j0, vbase, tid);
    load_q(0, 0);
    cp_async_commit();
    if (tid < C::kBr) load_stats(0, &lse_s[tid], &dsum_s[tid]);
  }

  const int key_row0 = warp * 16;  // this warp's first key row in the block
  const int dq_r = warp % C::kDqRowGroups, dq_c = warp / C::kDqRowGroups;
  const uint32_t kv_a = key_row0 * C::kRowBytes + a_off(lane, C::kRowBytes);
  const uint32_t qb_lane = b_off(lane, C::kRowBytes), qt_lane = bt_off(lane, C::kRowBytes);
  const uint32_t ds_a = ds_s + b_off(lane, C::kDsRowBytes) + dq_r * 32;
  const uint32_t kt_b = k_s + bt_off(lane, C::kRowBytes) + dq_c * C::kDqCols * 2;

  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    const int h = head_of(it), i0 = block_of(it) * C::kBr;
    cp_async_wait_all();
    // Step `it`'s Q, dO and statistics are visible; every warp has finished step it-1.
    __syncthreads();
    float next_l2 = 0.f, next_ds = 0.f;
    const bool more = it + 1 < total;
    if (more) {
      load_q(it + 1, buf ^ 1);
      cp_async_commit();
      if (tid < C::kBr) load_stats(it + 1, &next_l2, &next_ds);
    }
    const float* l2 = lse_s + buf * C::kBr;
    const float* dsm = dsum_s + buf * C::kBr;

    const uint32_t qb = q_buf(buf) + qb_lane, dob = do_buf(buf) + qb_lane;
    const uint32_t qt = q_buf(buf) + qt_lane, dot = do_buf(buf) + qt_lane;
    // S^T = K_w Q^T and dP^T = V_w dO^T: 16 keys x kBr queries per warp.
    float st[C::kNT][4], dpt[C::kNT][4];
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        st[nt][e] = 0.f;
        dpt[nt][e] = 0.f;
      }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t ak[4], av[4];
      ldmatrix_x4(ak, k_s + kv_a + ks * 32);
      ldmatrix_x4(av, v_s + kv_a + ks * 32);
#pragma unroll
      for (int np = 0; np < C::kNT / 2; ++np) {
        const uint32_t off = np * 16 * C::kRowBytes + ks * 32;
        uint32_t bq[4], bd[4];
        ldmatrix_x4(bq, qb + off);
        ldmatrix_x4(bd, dob + off);
        mma_16816<T>(st[2 * np], ak, bq[0], bq[1]);
        mma_16816<T>(st[2 * np + 1], ak, bq[2], bq[3]);
        mma_16816<T>(dpt[2 * np], av, bd[0], bd[1]);
        mma_16816<T>(dpt[2 * np + 1], av, bd[2], bd[3]);
      }
    }

    // P^T from the saved statistics, masked to exact zeros; dS^T = P^T (dP^T - Dsum).
    const bool need_mask =
        i0 + C::kBr > s.lq || j0 + C::kBc > s.lk || (p.causal && j0 + C::kBc - 1 > i0 + shift);
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = nt * 8 + ((lane & 3) << 1) + (e & 1);
        float pv = exp2f(st[nt][e] * p.scale_log2 - l2[qc]);
        if (need_mask) {
          const int j = j0 + key_row0 + (lane >> 2) + ((e >> 1) << 3);
          const int i = i0 + qc;
          if (i >= s.lq || j >= s.lk || (p.causal && j > i + shift)) pv = 0.f;
        }
        st[nt][e] = pv;
        dpt[nt][e] = pv * (dpt[nt][e] - dsm[qc]);
      }

      // dV += P^T dO and dK += dS^T Q (A operands from the accumulators, B = dO / Q transposed).
#pragma unroll
    for (int kk = 0; kk < C::kBr / 16; ++kk) {
      uint32_t ap[4], as[4];
      acc_to_a<T>(ap, st[2 * kk], st[2 * kk + 1]);
      acc_to_a<T>(as, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < C::kDT / 2; ++dp) {
        const uint32_t off = kk * 16 * C::kRowBytes + dp * 32;
        uint32_t bd[4], bq[4];
        ldmatrix_x4_trans(bd, dot + off);
        ldmatrix_x4_trans(bq, qt + off);
        mma_16816<T>(dv[2 * dp], ap, bd[0], bd[1]);
        mma_16816<T>(dv[2 * dp + 1], ap, bd[2], bd[3]);
        mma_16816<T>(dk[2 * dp], as, bq[0], bq[1]);
        mma_16816<T>(dk[2 * dp + 1], as, bq[2], bq[3]);
      }
    }

    // dS^T (rounded to T) into shared memory: [kBc keys][kBr queries].
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int kr = key_row0 + (lane >> 2) + r * 8;
        const int off = kr * C::kDsRowBytes + nt * 16 + ((lane & 3) << 2);
        *reinterpret_cast<uint32_t*>(ds_ptr + off) = pack2<T>(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
      }
    __syncthreads();

    // dQ[kBr, D] += dS K over the block's keys; this warp: 16 queries x kDqCols columns.
    float dqa[C::kDqNT][4];
#pragma unroll
    for (int dt = 0; dt < C::kDqNT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dqa[dt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < C::kBc / 16; ++kk) {
      uint32_t a[4];
      // A = dS (query rows, key columns) read transposed from dS^T.
      ldmatrix_x4_trans(a, ds_a + kk * 16 * C::kDsRowBytes);
#pragma unroll
      for (int dp = 0; dp < C::kDqNT / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, kt_b + kk * 16 * C::kRowBytes + dp * 32);
        mma_16816<T>(dqa[2 * dp], a, b[0], b[1]);
        mma_16816<T>(dqa[2 * dp + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + dq_r * 16 + (lane >> 2) + r * 8;
      if (i < s.lq) {
        float* dst = p.dq_acc + (static_cast<int64_t>(s.q0 + i) * p.hq + h) * D +
                     dq_c * C::kDqCols + ((lane & 3) << 1);
#pragma unroll
        for (int dt = 0; dt < C::kDqNT; ++dt) {
          atomicAdd(dst + dt * 8, dqa[dt][2 * r]);
          atomicAdd(dst + dt * 8 + 1, dqa[dt][2 * r + 1]);
        }
      }
    }

    // Statistics of the next step into the other buffer (last read in step it-1).
    if (more && tid < C::kBr) {
      lse_s[(buf ^ 1) * C::kBr + tid] = next_l2;
      dsum_s[(buf ^ 1) * C::kBr + tid] = next_ds;
    }
  }

  // dK * scale and dV for the keys that exist (zeros when no query sees them).
  T* dkp = static_cast<T*>(p.dk);
  T* dvp = static_cast<T*>(p.dv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = j0 + key_row0 + (lane >> 2) + r * 8;
    if (j < s.lk) {
      const int64_t base = (static_cast<int64_t>(s.k0 + j) * p.hk + hk) * D + ((lane & 3) << 1);
#pragma unroll
      for (int dt = 0; dt < C::kDT; ++dt) {
        *reinterpret_cast<uint32_t*>(dkp + base + dt * 8) =
            pack2<T>(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dvp + base + dt * 8) =
            pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(BwdCfg<D>::kThreads, 1)
    attention_bwd_mma_kernel(const BwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int hk = blockIdx.x % p.hk, b = blockIdx.x / p.hk;
  const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
  const int nblocks = (s.lk + BwdCfg<D>::kBc - 1) / BwdCfg<D>::kBc;
  // Rank order = key block order: with a causal mask the first key block is seen by the most
  // queries.
  for (int n = blockIdx.z; n < nblocks; n += gridDim.z) {
    bwd_tile<T, D>(p, s, hk, n, smem);
    __syncthreads();  // the next tile reuses shared memory
  }
}

// ---------------------------------------------------------------- backward pre/postprocess

// dsum[h, i] = sum_d dO[i,h,d] O[i,h,d] in A; lse2 (when non-null) = lse * log2 e, +inf where
// lse is -inf (P = 2^(x - inf) = 0 for rows that see nothing). One warp per (row, head).
template <typename T, typename A>
__global__ void attention_bwd_prep_kernel(const T* __restrict__ dout, int64_t do_stride,
                                          const T* __restrict__ out, int64_t o_stride,
                                          const A* __restrict__ lse, A* __restrict__ dsum,
                                          float* __restrict__ lse2, int tq, int hq, int d) {
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(tq) * hq) return;
  const int i = static_cast<int>(w / hq), h = static_cast<int>(w % hq);
  const T* g = dout + i * do_stride + static_cast<int64_t>(h) * d;
  const T* o = out + i * o_stride + static_cast<int64_t>(h) * d;
  A acc = 0;
  for (int j = lane; j < d; j += 32) acc += cu::to_acc(g[j]) * cu::to_acc(o[j]);
  acc = cu::warp_sum(acc);
  if (lane == 0) {
    const int64_t idx = static_cast<int64_t>(h) * tq + i;
    dsum[idx] = acc;
    if (lse2) {
      const float l = static_cast<float>(lse[idx]);
      lse2[idx] = l == -INFINITY ? INFINITY : l * kLog2e;
    }
  }
}

// dq = T(acc * scale), n elements.
template <typename T>
__global__ void attention_dq_convert_kernel(const float* __restrict__ acc, T* __restrict__ dq,
                                            int64_t n, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dq[i] = cu::from_acc<T>(acc[i] * scale);
}

// Rows of x that belong to no sequence ([0, cu[0]) and [cu[batch], rows), clamped) get `value`;
// x is [rows, row_elems] contiguous, or [row_elems, rows] with `transposed` (lse's [H, T]).
template <typename T>
__global__ void attention_uncovered_fill_kernel(T* __restrict__ x, int64_t row_elems, int rows,
                                                const int* __restrict__ cu, int batch, T value,
                                                bool transposed) {
  const UncoveredRows u = uncovered_rows(cu[0], cu[batch], rows);
  const int64_t n = u.count(rows) * row_elems;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[uncovered_offset(idx, u, rows, row_elems, transposed)] = value;
}

// ---------------------------------------------------------------- simple kernels

constexpr int kSimpleMaxD = 512;
constexpr int kSimplePer = kSimpleMaxD / 32;  // head_dim values per lane
constexpr int kSimpleThreads = 256;

struct SimpleParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const void* out;
  void* o;    // forward output
  void* lse;  // forward output [Hq, Tq]
  const void* lse_in;
  const void* dsum;  // [Hq, Tq] in A
  void* dq;
  void* dk;
  void* dv;
  int64_t q_stride, k_stride, v_stride, do_stride;
  const int* cu_q;
  const int* cu_k;
  int tq, tk, hq, hk, group, batch, d;
  double scale;
  bool causal;
};

// Loads one head row (d values) into this lane's registers: value e is column lane + 32 e.
template <typename T, typename A>
__device__ __forceinline__ void load_row(const T* src, int d, int lane, A (&x)[kSimplePer]) {
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) {
    const int c = lane + 32 * e;
    x[e] = c < d ? cu::to_acc(src[c]) : A(0);
  }
}
template <typename T, typename A>
__device__ __forceinline__ void store_row(T* dst, int d, int lane, const A (&x)[kSimplePer],
                                          A mul) {
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) {
    const int c = lane + 32 * e;
    if (c < d) dst[c] = cu::from_acc<T>(x[e] * mul);
  }
}
template <typename T, typename A>
__device__ __forceinline__ A dot_row(const T* src, int d, int lane, const A (&x)[kSimplePer]) {
  A acc = 0;
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) {
    const int c = lane + 32 * e;
    if (c < d) acc += x[e] * cu::to_acc(src[c]);
  }
  return cu::warp_sum(acc);
}
template <typename A>
__device__ __forceinline__ A exp_a(A x) {
  if constexpr (std::is_same_v<A, float>)
    return expf(x);
  else
    return exp(x);
}
template <typename A>
__device__ __forceinline__ A log_a(A x) {
  if constexpr (std::is_same_v<A, float>)
    return logf(x);
  else
    return log(x);
}

// Number of keys query i (of lq) sees out of lk.
__device__ __forceinline__ int visible_keys(bool causal, int i, int lq, int lk) {
  return causal ? min(max(i + lk - lq + 1, 0), lk) : lk;
}

template <typename T>
__global__ void __launch_bounds__(kSimpleThreads)
    attention_fwd_simple_kernel(const SimpleParams p) {
  using A = cu::acc_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(p.tq) * p.hq) return;
  const int row = static_cast<int>(w / p.hq), h = static_cast<int>(w % p.hq);
  const int hk = h / p.group;
  T* orow = static_cast<T*>(p.o) + (static_cast<int64_t>(row) * p.hq + h) * p.d;
  A* lse = static_cast<A*>(p.lse) + static_cast<int64_t>(h) * p.tq + row;
  A o[kSimplePer];
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) o[e] = 0;
  const int b = seq_of_row(p.cu_q, p.batch, row);
  A m = -INFINITY, l = 0;
  if (b >= 0) {
    const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
    const int vis = visible_keys(p.causal, row - s.q0, s.lq, s.lk);
    A q[kSimplePer];
    load_row(static_cast<const T*>(p.q) + row * p.q_stride + static_cast<int64_t>(h) * p.d, p.d,
             lane, q);
    const T* kb = static_cast<const T*>(p.k) + s.k0 * p.k_stride + static_cast<int64_t>(hk) * p.d;
    const T* vb = static_cast<const T*>(p.v) + s.k0 * p.v_stride + static_cast<int64_t>(hk) * p.d;
    const A scale = static_cast<A>(p.scale);
    for (int j = 0; j < vis; ++j) {
      const A sc = dot_row(kb + j * p.k_stride, p.d, lane, q) * scale;
      A v[kSimplePer];
      load_row(vb + j * p.v_stride, p.d, lane, v);
      if (sc > m) {
        const A alpha = m == -INFINITY ? A(0) : exp_a(m - sc);
        l = l * alpha + 1;
#pragma unroll
        for (int e = 0; e < kSimplePer; ++e) o[e] = o[e] * alpha + v[e];
        m = sc;
      } else {
        const A pj = exp_a(sc - m);
        l += pj;
#pragma unroll
        for (int e = 0; e < kSimplePer; ++e) o[e] += pj * v[e];
      }
    }
  }
  const bool empty = !(l > 0);
  store_row(orow, p.d, lane, o, empty ? A(0) : A(1) / l);
  if (lane == 0) *lse = empty ? A(-INFINITY) : m + log_a(l);
}

// dq for one (query row, head) per warp: dq = scale sum_j p_ij (dO_i . v_j - Dsum_i) k_j.
template <typename T>
__global__ void __launch_bounds__(kSimpleThreads)
    attention_bwd_dq_simple_kernel(const SimpleParams p) {
  using A = cu::acc_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(p.tq) * p.hq) return;
  const int row = static_cast<int>(w / p.hq), h = static_cast<int>(w % p.hq);
  const int hk = h / p.group;
  A acc[kSimplePer];
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) acc[e] = 0;
  const int b = seq_of_row(p.cu_q, p.batch, row);
  const int64_t stat = static_cast<int64_t>(h) * p.tq + row;
  const A lse = static_cast<const A*>(p.lse_in)[stat];
  if (b >= 0 && lse != -INFINITY) {
    const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
    const int vis = visible_keys(p.causal, row - s.q0, s.lq, s.lk);
    const A dsum = static_cast<const A*>(p.dsum)[stat];
    A q[kSimplePer], g[kSimplePer];
    load_row(static_cast<const T*>(p.q) + row * p.q_stride + static_cast<int64_t>(h) * p.d, p.d,
             lane, q);
    load_row(static_cast<const T*>(p.dout) + row * p.do_stride + static_cast<int64_t>(h) * p.d, p.d,
             lane, g);
    const T* kb = static_cast<const T*>(p.k) + s.k0 * p.k_stride + static_cast<int64_t>(hk) * p.d;
    const T* vb = static_cast<const T*>(p.v) + s.k0 * p.v_stride + static_cast<int64_t>(hk) * p.d;
    const A scale = static_cast<A>(p.scale);
    for (int j = 0; j < vis; ++j) {
      const T* kr = kb + j * p.k_stride;
      const A pj = exp_a(dot_row(kr, p.d, lane, q) * scale - lse);
      const A ds = pj * (dot_row(vb + j * p.v_stride, p.d, lane, g) - dsum);
      A kv[kSimplePer];
      load_row(kr, p.d, lane, kv);
#pragma unroll
      for (int e = 0; e < kSimplePer; ++e) acc[e] += ds * kv[e];
    }
  }
  store_row(static_cast<T*>(p.dq) + (static_cast<int64_t>(row) * p.hq + h) * p.d, p.d, lane, acc,
            static_cast<A>(p.scale));
}

// dk, dv for one (key row, KV head) per warp, summed over the query heads of the group.
template <typename T>
__global__ void __launch_bounds__(kSimpleThreads)
    attention_bwd_dkdv_simple_kernel(const SimpleParams p) {
  using A = cu::acc_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(p.tk) * p.hk) return;
  const int row = static_cast<int>(w / p.hk), hk = static_cast<int>(w % p.hk);
  A dk[kSimplePer], dv[kSimplePer];
#pragma unroll
  for (int e = 0; e < kSimplePer; ++e) {
    dk[e] = 0;
    dv[e] = 0;
  }
  const int b = seq_of_row(p.cu_k, p.batch, row);
  if (b >= 0) {
    const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
    const int j = row - s.k0;
    // Query i sees key j iff j <= i + lk - lq.
    const int i_first = p.causal ? max(0, j - (s.lk - s.lq)) : 0;
    A kr[kSimplePer], vr[kSimplePer];
    load_row(static_cast<const T*>(p.k) + row * p.k_stride + static_cast<int64_t>(hk) * p.d, p.d,
             lane, kr);
    load_row(static_cast<const T*>(p.v) + row * p.v_stride + static_cast<int64_t>(hk) * p.d, p.d,
             lane, vr);
    const A scale = static_cast<A>(p.scale);
    const A* lse = static_cast<const A*>(p.lse_in);
    const A* dsum = static_cast<const A*>(p.dsum);
    for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
      for (int i = i_first; i < s.lq; ++i) {
        const int qrow = s.q0 + i;
        const int64_t stat = static_cast<int64_t>(h) * p.tq + qrow;
        const A l = lse[stat];
        if (l == -INFINITY) continue;
        const T* qp =
            static_cast<const T*>(p.q) + qrow * p.q_stride + static_cast<int64_t>(h) * p.d;
        const T* gp =
            static_cast<const T*>(p.dout) + qrow * p.do_stride + static_cast<int64_t>(h) * p.d;
        const A pj = exp_a(dot_row(qp, p.d, lane, kr) * scale - l);
        const A ds = pj * (dot_row(gp, p.d, lane, vr) - dsum[stat]);
        A qv[kSimplePer], gv[kSimplePer];
        load_row(qp, p.d, lane, qv);
        load_row(gp, p.d, lane, gv);
#pragma unroll
        for (int e = 0; e < kSimplePer; ++e) {
          dv[e] += pj * gv[e];
          dk[e] += ds * qv[e];
        }
      }
    }
  }
  const int64_t off = (static_cast<int64_t>(row) * p.hk + hk) * p.d;
  store_row(static_cast<T*>(p.dk) + off, p.d, lane, dk, static_cast<A>(p.scale));
  store_row(static_cast<T*>(p.dv) + off, p.d, lane, dv, A(1));
}

// ---------------------------------------------------------------- launchers

int max_smem_optin(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lk(mu);
  if (cache.size() <= static_cast<size_t>(device)) cache.resize(device + 1, -1);
  if (cache[device] < 0) {
    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cache[device] = v;
  }
  return cache[device];
}

// Grid z (ranks), capped by the hardware limit; CTAs loop over the remaining ranks.
unsigned rank_grid(int64_t max_len, int block) {
  const int64_t ranks = std::max<int64_t>(1, (max_len + block - 1) / block);
  return static_cast<unsigned>(std::min<int64_t>(ranks, 65535));
}

template <typename T, int D>
void attention_fwd_mma_launch(const FwdParams& p, int64_t max_seqlen_q, cudaStream_t stream) {
  using C = FwdCfg<D>;
  auto kernel = attention_fwd_mma_kernel<T, D>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  const dim3 grid(static_cast<unsigned>(p.batch * p.hq), 1, rank_grid(max_seqlen_q, C::kBr));
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void attention_bwd_mma_launch(const BwdParams& p, int64_t max_seqlen_k, cudaStream_t stream) {
  using C = BwdCfg<D>;
  auto kernel = attention_bwd_mma_kernel<T, D>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  const dim3 grid(static_cast<unsigned>(p.batch * p.hk), 1, rank_grid(max_seqlen_k, C::kBc));
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

unsigned warp_grid(int64_t warps) {
  const int64_t per_block = kSimpleThreads / 32;
  const int64_t blocks = (warps + per_block - 1) / per_block;
  LT_CHECK(blocks < (int64_t{1} << 31), "attention: ", warps, " rows x heads is too many");
  return static_cast<unsigned>(std::max<int64_t>(blocks, 1));
}

template <typename T>
void attention_fwd_simple_launch(const SimpleParams& p, cudaStream_t stream) {
  attention_fwd_simple_kernel<T>
      <<<warp_grid(static_cast<int64_t>(p.tq) * p.hq), kSimpleThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_bwd_simple_launch(const SimpleParams& p, cudaStream_t stream) {
  if (p.tq > 0) {
    attention_bwd_dq_simple_kernel<T>
        <<<warp_grid(static_cast<int64_t>(p.tq) * p.hq), kSimpleThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH();
  }
  if (p.tk > 0) {
    attention_bwd_dkdv_simple_kernel<T>
        <<<warp_grid(static_cast<int64_t>(p.tk) * p.hk), kSimpleThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH();
  }
}

template <typename T, typename A>
void attention_bwd_prep_launch(const T* dout, int64_t do_stride, const T* out, int64_t o_stride,
                               const A* lse, A* dsum, float* lse2, int tq, int hq, int d,
                               cudaStream_t stream) {
  attention_bwd_prep_kernel<T, A>
      <<<warp_grid(static_cast<int64_t>(tq) * hq), kSimpleThreads, 0, stream>>>(
          dout, do_stride, out, o_stride, lse, dsum, lse2, tq, hq, d);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_uncovered_fill_launch(T* x, int64_t row_elems, int rows, const int* cu, int batch,
                                     T value, bool transposed, Device dev, cudaStream_t stream) {
  if (rows == 0 || row_elems == 0) return;
  const unsigned blocks =
      cu::grid_blocks(static_cast<int64_t>(rows) * row_elems, 256, dev.index, 2, 256);
  attention_uncovered_fill_kernel<T>
      <<<blocks, 256, 0, stream>>>(x, row_elems, rows, cu, batch, value, transposed);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_dq_convert_launch(const float* acc, T* dq, int64_t n, float scale, Device dev,
                                 cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = cu::grid_blocks(n, 256, dev.index, 4, 256);
  attention_dq_convert_kernel<T><<<blocks, 256, 0, stream>>>(acc, dq, n, scale);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- adapters

DType stat_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

struct Dims {
  int64_t tq, tk, hq, hk, d, group;
};

Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  LT_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  LT_CHECK(q.dim() == 3 && k.dim() == 3 && v.shape() == k.shape() && q.size(2) == k.size(2) &&
               q.size(2) > 0 && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
           op, ": q ", q.str(), ", k ", k.str(), ", v ", v.str(),
           " (want q [Tq,Hq,D], k and v [Tk,Hk,D], Hq % Hk == 0)");
  LT_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && dtype_is_floating(q.dtype()), op,
           ": q ", q.str(), ", k ", k.str(), ", v ", v.str(), " need one float dtype");
  const Device d = q.device();
  LT_CHECK(d.is_cuda(), op, ": q ", q.str(), " is not on a CUDA device");
  cu::check_on(k, d, op, "k");
  cu::check_on(v, d, op, "v");
  LT_CHECK(q.size(0) < (int64_t{1} << 31) && k.size(0) < (int64_t{1} << 31) &&
               q.size(1) * q.size(2) < (int64_t{1} << 31),
           op, ": q ", q.str(), ", k ", k.str(), " exceed the kernels' 32-bit row indices");
  return {q.size(0), k.size(0), q.size(1), k.size(1), q.size(2), q.size(1) / k.size(1)};
}

// A [T,H,D] operand whose heads and head_dim are dense, with its row stride; other layouts (and,
// for the tensor-core path, rows not 16-byte aligned) are copied into a contiguous workspace.
struct RowsOperand {
  Tensor keep;
  const void* ptr = nullptr;
  int64_t stride = 0;
};

RowsOperand rows_operand(const Tensor& t, bool need_align16) {
  const Shape& st = t.strides();
  const int64_t hd = t.size(1) * t.size(2);
  const bool dense_rows = (st[2] == 1 || t.size(2) <= 1) && (st[1] == t.size(2) || t.size(1) <= 1);
  const int64_t stride = t.size(0) <= 1 ? hd : st[0];
  bool ok = t.size(0) <= 1 ? t.is_contiguous() : dense_rows && stride >= hd;
  if (ok && need_align16)
    ok = cu::aligned16(t.data_ptr()) && (stride * static_cast<int64_t>(t.element_size())) % 16 == 0;
  RowsOperand r;
  if (ok) {
    r.keep = t;
    r.ptr = t.data_ptr();
    r.stride = stride;
    return r;
  }
  r.keep = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  ops::copy(r.keep, t);
  r.ptr = r.keep.data_ptr();
  r.stride = hd;
  return r;
}

// An output written by the kernels: the tensor itself, or (when misaligned for the tensor-core
// path) a workspace that is copied into it afterwards.
struct OutOperand {
  Tensor target;
  Tensor buf;
  void* ptr() const { return buf.data_ptr(); }
  void finish() const {
    if (!buf.shares_storage(target) || buf.offset() != target.offset()) ops::copy(target, buf);
  }
};

OutOperand out_operand(const Tensor& t, bool need_align16) {
  OutOperand o;
  o.target = t;
  o.buf = t;
  if (need_align16 && !cu::aligned16(t.data_ptr()))
    o.buf = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  return o;
}

// cu_seqlens as a device i32 tensor, with the longest sequences (from the hints, or from a host
// copy when a hint is missing; a host tensor is validated as on the CPU path).
struct Seqs {
  Tensor cu_q, cu_k;
  int batch = 0;
  int64_t max_q = 0, max_k = 0;
};

Tensor cu_on_device(const Tensor& cu, Device d) {
  if (cu.device() == d && cu.dtype() == DType::kI32 && cu.is_contiguous()) return cu;
  Tensor out = Tensor::empty(cu.shape(), DType::kI32, d, MemTag::kWorkspace);
  ops::copy(out, cu);
  return out;
}

Seqs prepare_seqs(const Tensor& cu_q, const Tensor& cu_k, const Dims& dm,
                  const AttentionOptions& opt, Device d, const char* op) {
  LT_CHECK(cu_q.defined() && cu_k.defined() && cu_q.dim() == 1 && cu_k.dim() == 1 &&
               cu_q.numel() == cu_k.numel() && cu_q.numel() >= 1,
           op, ": cu_seqlens_q and cu_seqlens_k must both be [B+1]");
  LT_CHECK((cu_q.dtype() == DType::kI32 || cu_q.dtype() == DType::kI64) &&
               (cu_k.dtype() == DType::kI32 || cu_k.dtype() == DType::kI64),
           op, ": cu_seqlens ", cu_q.str(), ", ", cu_k.str(), " must be i32 or i64");
  LT_CHECK(cu_q.device().is_cpu() || cu_q.device() == d, op, ": cu_seqlens_q ", cu_q.str(),
           " is on another device than q");
  LT_CHECK(cu_k.device().is_cpu() || cu_k.device() == d, op, ": cu_seqlens_k ", cu_k.str(),
           " is on another device than k");
  LT_CHECK(cu_q.numel() - 1 < (int64_t{1} << 31) / std::max<int64_t>(dm.hq, 1), op, ": ",
           cu_q.numel() - 1, " sequences x ", dm.hq, " heads is too many");
  Seqs s;
  s.batch = static_cast<int>(cu_q.numel() - 1);
  s.max_q = opt.max_seqlen_q;
  s.max_k = opt.max_seqlen_k;
  const bool host = cu_q.device().is_cpu() && cu_k.device().is_cpu();
  if (host || s.max_q <= 0 || s.max_k <= 0) {
    const std::vector<int64_t> cq = cu_q.to_i64(), ck = cu_k.to_i64();
    int64_t mq = 0, mk = 0;
    for (const auto* c : {&cq, &ck}) {
      const int64_t total = c == &cq ? dm.tq : dm.tk;
      LT_CHECK(c->front() == 0 && c->back() <= total, op, ": cu_seqlens run from ", c->front(),
               " to ", c->back(), " for ", total, " rows");
      for (int b = 0; b < s.batch; ++b)
        LT_CHECK((*c)[b] <= (*c)[b + 1], op, ": cu_seqlens decrease at ", b, ": ", (*c)[b], " > ",
                 (*c)[b + 1]);
    }
    for (int b = 0; b < s.batch; ++b) {
      mq = std::max(mq, cq[b + 1] - cq[b]);
      mk = std::max(mk, ck[b + 1] - ck[b]);
    }
    s.max_q = mq;
    s.max_k = mk;
  }
  s.cu_q = cu_on_device(cu_q, d);
  s.cu_k = cu_on_device(cu_k, d);
  return s;
}

// The tensor-core path applies: bf16/f16, head_dim 64 or 128, sm_80+, enough shared memory.
bool use_mma(DType dt, int64_t head_dim, Device d, bool backward) {
  if (dt != DType::kBF16 && dt != DType::kF16) return false;
  if (head_dim != 64 && head_dim != 128) return false;
  if (cu::device_info(d.index).major < 8) return false;
  const int need = backward ? (head_dim == 64 ? BwdCfg<64>::kSmem : BwdCfg<128>::kSmem)
                            : (head_dim == 64 ? FwdCfg<64>::kSmem : FwdCfg<128>::kSmem);
  return max_smem_optin(d.index) >= need;
}

template <typename T>
void fwd_mma_dispatch(const FwdParams& p, int64_t d, int64_t max_q, cudaStream_t s) {
  if (d == 64)
    attention_fwd_mma_launch<T, 64>(p, max_q, s);
  else
    attention_fwd_mma_launch<T, 128>(p, max_q, s);
}
template <typename T>
void bwd_mma_dispatch(const BwdParams& p, int64_t d, int64_t max_k, cudaStream_t s) {
  if (d == 64)
    attention_bwd_mma_launch<T, 64>(p, max_k, s);
  else
    attention_bwd_mma_launch<T, 128>(p, max_k, s);
}

void check_simple_head_dim(const char* op, int64_t d) {
  LT_CHECK(d <= kSimpleMaxD, op, ": head_dim ", d,
           " is not supported on CUDA (tensor-core kernels: 64 and 128 in bf16/f16; the simple "
           "kernel: up to ",
           kSimpleMaxD, ")");
}

// Fills what every attention parameter block (FwdParams, BwdParams, SimpleParams) shares: the
// q/k/v rows, the sequence layout, the head counts and causality.
template <typename P>
void set_layout(P& p, const RowsOperand& qr, const RowsOperand& kr, const RowsOperand& vr,
                const Seqs& s, const Dims& dm, bool causal) {
  p.q = qr.ptr;
  p.k = kr.ptr;
  p.v = vr.ptr;
  p.q_stride = qr.stride;
  p.k_stride = kr.stride;
  p.v_stride = vr.stride;
  p.cu_q = s.cu_q.data<int32_t>();
  p.cu_k = s.cu_k.data<int32_t>();
  p.tq = static_cast<int>(dm.tq);
  p.tk = static_cast<int>(dm.tk);
  p.hq = static_cast<int>(dm.hq);
  p.hk = static_cast<int>(dm.hk);
  p.group = static_cast<int>(dm.group);
  p.batch = s.batch;
  p.causal = causal;
}

}  // namespace

void attention_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                        const AttentionOptions& opt, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_fwd_cuda";
  const Dims dm = check_qkv(op, q, k, v);
  const Device d = q.device();
  cu::check_operand(out, d, op, "out");
  cu::check_operand(lse, d, op, "lse");
  LT_CHECK(out.shape() == q.shape() && out.dtype() == q.dtype(), op, ": out ", out.str(), " for q ",
           q.str());
  LT_CHECK(lse.shape() == (Shape{dm.hq, dm.tq}) && lse.dtype() == stat_dtype(q.dtype()), op,
           ": lse ", lse.str(), " for q ", q.str(), " (want [", dm.hq, ", ", dm.tq, "] ",
           dtype_name(stat_dtype(q.dtype())), ")");
  cu::DeviceGuard guard(d);
  const Seqs s = prepare_seqs(cu_seqlens_q, cu_seqlens_k, dm, opt, d, op);
  if (dm.tq == 0) return;
  cudaStream_t stream = cu::stream_of(d);
  const double scale = opt.scale != 0.0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(dm.d));
  const bool mma = use_mma(q.dtype(), dm.d, d, /*backward=*/false);
  if (!mma) check_simple_head_dim(op, dm.d);
  const RowsOperand qr = rows_operand(q, mma), kr = rows_operand(k, mma), vr = rows_operand(v, mma);
  const OutOperand o = out_operand(out, mma);

  if (mma) {
    FwdParams p{};
    set_layout(p, qr, kr, vr, s, dm, opt.causal);
    p.out = o.ptr();
    p.lse = lse.data<float>();
    p.o_stride = dm.hq * dm.d;
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    if (s.batch > 0) {
      if (q.dtype() == DType::kBF16)
        fwd_mma_dispatch<__nv_bfloat16>(p, dm.d, s.max_q, stream);
      else
        fwd_mma_dispatch<__half>(p, dm.d, s.max_q, stream);
    }
    // Rows outside every sequence (before cu[0], after cu[B]): out = 0, lse = -inf.
    LT_CU_DISPATCH_F32_16(q.dtype(), T, {
      attention_uncovered_fill_launch<T>(static_cast<T*>(o.ptr()), dm.hq * dm.d,
                                         static_cast<int>(dm.tq), p.cu_q, s.batch, T{}, false, d,
                                         stream);
    });
    attention_uncovered_fill_launch<float>(lse.data<float>(), dm.hq, static_cast<int>(dm.tq),
                                           p.cu_q, s.batch, -std::numeric_limits<float>::infinity(),
                                           true, d, stream);
  } else {
    SimpleParams p{};
    set_layout(p, qr, kr, vr, s, dm, opt.causal);
    p.o = o.ptr();
    p.lse = lse.data_ptr();
    p.d = static_cast<int>(dm.d);
    p.scale = scale;
    LT_CU_DISPATCH_FLOAT(q.dtype(), T, attention_fwd_simple_launch<T>(p, stream));
  }
  o.finish();
}

void attention_bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens_q,
                        const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_bwd_cuda";
  const Dims dm = check_qkv(op, q, k, v);
  const Device d = q.device();
  cu::check_on(dout, d, op, "dout");
  cu::check_on(out, d, op, "out");
  cu::check_on(lse, d, op, "lse");
  LT_CHECK(dout.shape() == q.shape() && dout.dtype() == q.dtype() && out.shape() == q.shape() &&
               out.dtype() == q.dtype(),
           op, ": dout ", dout.str(), ", out ", out.str(), " for q ", q.str());
  LT_CHECK(lse.shape() == (Shape{dm.hq, dm.tq}) && lse.dtype() == stat_dtype(q.dtype()), op,
           ": lse ", lse.str(), " for q ", q.str());
  auto check_grad = [&](const Tensor& g, const Tensor& x, const char* name) {
    if (!g.defined()) return;
    cu::check_operand(g, d, op, name);
    LT_CHECK(g.shape() == x.shape() && g.dtype() == x.dtype(), op, ": ", name, " ", g.str(),
             " for ", x.str());
  };
  check_grad(dq, q, "dq");
  check_grad(dk, k, "dk");
  check_grad(dv, v, "dv");
  cu::DeviceGuard guard(d);
  const Seqs s = prepare_seqs(cu_seqlens_q, cu_seqlens_k, dm, opt, d, op);
  if (!dq.defined() && !dk.defined() && !dv.defined()) return;
  cudaStream_t stream = cu::stream_of(d);
  const double scale = opt.scale != 0.0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(dm.d));
  const bool mma = use_mma(q.dtype(), dm.d, d, /*backward=*/true);
  if (!mma) check_simple_head_dim(op, dm.d);
  // Gradients nobody asked for still have to be written somewhere by the fused kernels.
  auto grad_or_scratch = [&](const Tensor& g, const Tensor& x) {
    return g.defined() ? g : Tensor::empty(x.shape(), x.dtype(), d, MemTag::kWorkspace);
  };
  const OutOperand gq = out_operand(grad_or_scratch(dq, q), mma);
  const OutOperand gk = out_operand(grad_or_scratch(dk, k), mma);
  const OutOperand gv = out_operand(grad_or_scratch(dv, v), mma);
  if (dm.tq == 0 && dm.tk == 0) return;
  const RowsOperand qr = rows_operand(q, mma), kr = rows_operand(k, mma), vr = rows_operand(v, mma);
  const RowsOperand gr = rows_operand(dout, mma), orr = rows_operand(out, false);
  const Tensor lc = cu::contiguous_ws(lse);
  const DType sdt = stat_dtype(q.dtype());
  Tensor dsum = Tensor::empty({dm.hq, std::max<int64_t>(dm.tq, 1)}, sdt, d, MemTag::kWorkspace);

  if (mma) {
    Tensor lse2 =
        Tensor::empty({dm.hq, std::max<int64_t>(dm.tq, 1)}, DType::kF32, d, MemTag::kWorkspace);
    const int64_t nacc = dm.tq * dm.hq * dm.d;
    Tensor dq_acc = Tensor::empty({std::max<int64_t>(nacc, 1)}, DType::kF32, d, MemTag::kWorkspace);
    if (nacc > 0) {
      CUDA_CHECK(cudaMemsetAsync(dq_acc.data_ptr(), 0, static_cast<size_t>(nacc) * 4, stream));
      LT_CU_DISPATCH_F32_16(q.dtype(), T, {
        attention_bwd_prep_launch<T, float>(
            static_cast<const T*>(gr.ptr), gr.stride, static_cast<const T*>(orr.ptr), orr.stride,
            lc.data<float>(), dsum.data<float>(), lse2.data<float>(), static_cast<int>(dm.tq),
            static_cast<int>(dm.hq), static_cast<int>(dm.d), stream);
      });
    }
    BwdParams p{};
    set_layout(p, qr, kr, vr, s, dm, opt.causal);
    p.dout = gr.ptr;
    p.lse2 = lse2.data<float>();
    p.dsum = dsum.data<float>();
    p.dq_acc = dq_acc.data<float>();
    p.dk = gk.ptr();
    p.dv = gv.ptr();
    p.do_stride = gr.stride;
    p.scale = static_cast<float>(scale);
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    if (s.batch > 0 && dm.tk > 0) {
      if (q.dtype() == DType::kBF16)
        bwd_mma_dispatch<__nv_bfloat16>(p, dm.d, s.max_k, stream);
      else
        bwd_mma_dispatch<__half>(p, dm.d, s.max_k, stream);
    }
    LT_CU_DISPATCH_F32_16(q.dtype(), T, {
      // dq for every row (rows outside sequences got no contribution: zero).
      attention_dq_convert_launch<T>(dq_acc.data<float>(), static_cast<T*>(gq.ptr()), nacc,
                                     static_cast<float>(scale), d, stream);
      // Keys outside every sequence: zero dk, dv.
      const T zero = T{};
      attention_uncovered_fill_launch<T>(static_cast<T*>(gk.ptr()), dm.hk * dm.d,
                                         static_cast<int>(dm.tk), p.cu_k, s.batch, zero, false, d,
                                         stream);
      attention_uncovered_fill_launch<T>(static_cast<T*>(gv.ptr()), dm.hk * dm.d,
                                         static_cast<int>(dm.tk), p.cu_k, s.batch, zero, false, d,
                                         stream);
    });
  } else {
    LT_CU_DISPATCH_FLOAT(q.dtype(), T, {
      using A = cu::acc_of<T>;
      if (dm.tq > 0)
        attention_bwd_prep_launch<T, A>(
            static_cast<const T*>(gr.ptr), gr.stride, static_cast<const T*>(orr.ptr), orr.stride,
            static_cast<const A*>(lc.data_ptr()), static_cast<A*>(dsum.data_ptr()), nullptr,
            static_cast<int>(dm.tq), static_cast<int>(dm.hq), static_cast<int>(dm.d), stream);
      SimpleParams p{};
      set_layout(p, qr, kr, vr, s, dm, opt.causal);
      p.dout = gr.ptr;
      p.lse_in = lc.data_ptr();
      p.dsum = dsum.data_ptr();
      p.dq = gq.ptr();
      p.dk = gk.ptr();
      p.dv = gv.ptr();
      p.do_stride = gr.stride;
      p.d = static_cast<int>(dm.d);
      p.scale = scale;
      attention_bwd_simple_launch<T>(p, stream);
    });
  }
  if (dq.defined()) gq.finish();
  if (dk.defined()) gk.finish();
  if (dv.defined()) gv.finish();
}

}  // namespace leantune::kernels
