// Tensor-core building blocks shared by the attention forward and backward units
// (kernels/attention_mma_fwd.cu, attention_mma_bwd.cu): mma.sync m16n8k16, ldmatrix, cp.async
// and the padded shared tiles they read (sm_80+).
#pragma once

#include "kernels/attention_common.cuh"

namespace leantune::kernels::attention_detail {

// ---------------------------------------------------------------- tensor-core primitives

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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

// The products of the kernels' k16 steps, B read as 16-column ldmatrix.x4 fragments: pair np's
// fragment b (load_b(np, b)) feeds columns 16 np..16 np + 15, its n8 halves b[0..1] and b[2..3]
// into tiles 2 np and 2 np + 1.
//   mma_rows: c[mt][n] += a[mt] b for every A fragment mt (a row block of kMT x 16 rows).
//   mma_rows2: c1[n] += a1 b1 and c2[n] += a2 b2, load_b(np, b1, b2) reading both fragments
//   before the four products (two GEMMs interleaved).
template <typename T, int kMT, int kNT, typename LoadB>
__device__ __forceinline__ void mma_rows(float (&c)[kMT][kNT][4], const uint32_t (&a)[kMT][4],
                                         LoadB load_b) {
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    uint32_t b[4];
    load_b(np, b);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      mma_16816<T>(c[mt][2 * np], a[mt], b[0], b[1]);
      mma_16816<T>(c[mt][2 * np + 1], a[mt], b[2], b[3]);
    }
  }
}
template <typename T, int kNT, typename LoadB>
__device__ __forceinline__ void mma_rows2(float (&c1)[kNT][4], const uint32_t (&a1)[4],
                                          float (&c2)[kNT][4], const uint32_t (&a2)[4],
                                          LoadB load_b) {
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    uint32_t b1[4], b2[4];
    load_b(np, b1, b2);
    mma_16816<T>(c1[2 * np], a1, b1[0], b1[1]);
    mma_16816<T>(c1[2 * np + 1], a1, b1[2], b1[3]);
    mma_16816<T>(c2[2 * np], a2, b2[0], b2[1]);
    mma_16816<T>(c2[2 * np + 1], a2, b2[2], b2[3]);
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

}  // namespace leantune::kernels::attention_detail
