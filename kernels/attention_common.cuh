// Shared declarations of the CUDA attention translation units (contract and design in
// kernels/attention.cu): sequence bounds, the kernels' parameter blocks, grid helpers and the
// launchers each unit exports. attention_mma_fwd.cu, attention_mma_bwd.cu and attention_simple.cu
// hold the kernels, each compiled once; attention.cu checks operands and dispatches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/cuda_utils.cuh"
#include "kernels/attention_tiles.h"

namespace leantune::kernels::attention_detail {

using attention_tiles::BwdCfg;
using attention_tiles::FwdCfg;
using attention_tiles::padded_row_bytes;

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

// ---------------------------------------------------------------- parameter blocks

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
  int window;  // sliding window (keys a query sees); 0 = none
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
  int window;  // sliding window; 0 = none
};

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
  int window;          // sliding window; 0 = none
  double softcap;      // score soft-cap; 0 = off (only the simple kernels implement it)
  double softcap_inv;  // 1 / softcap (0 when off)
};

// ---------------------------------------------------------------- grids

// Grid z (ranks), capped by the hardware limit; CTAs loop over the remaining ranks.
inline unsigned rank_grid(int64_t max_len, int block) {
  const int64_t ranks = std::max<int64_t>(1, (max_len + block - 1) / block);
  return static_cast<unsigned>(std::min<int64_t>(ranks, 65535));
}

inline unsigned warp_grid(int64_t warps) {
  const int64_t per_block = kSimpleThreads / 32;
  const int64_t blocks = (warps + per_block - 1) / per_block;
  LT_CHECK(blocks < (int64_t{1} << 31), "attention: ", warps, " rows x heads is too many");
  return static_cast<unsigned>(std::max<int64_t>(blocks, 1));
}

// ---------------------------------------------------------------- launchers by unit

// attention_mma_fwd.cu: dt bf16|f16, head_dim 64|128.
void fwd_mma(const FwdParams& p, DType dt, int64_t head_dim, int64_t max_seqlen_q,
             cudaStream_t stream);
// attention_mma_bwd.cu: dt bf16|f16, head_dim 64|128; warps 8, or 4 for head_dim 128 (the
// smaller tile, bwd128_warps in attention.cu).
void bwd_mma(const BwdParams& p, DType dt, int64_t head_dim, int warps, int64_t max_seqlen_k,
             cudaStream_t stream);
// attention_simple.cu: any float dtype, head_dim <= kSimpleMaxD.
void fwd_simple(const SimpleParams& p, DType dt, cudaStream_t stream);
void bwd_simple(const SimpleParams& p, DType dt, cudaStream_t stream);

}  // namespace leantune::kernels::attention_detail
