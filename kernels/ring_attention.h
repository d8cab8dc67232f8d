// Zigzag ring attention (context parallelism) over a Communicator: the sequence dimension of a
// packed varlen batch is split over the `cp` ranks of a communicator, each rank holding chunks
// r and 2cp-1-r of every document, so causal work is balanced (rank r computes (r+1/2) +
// (2cp-1-r+1/2) = 2cp half-blocks). Following zhuzilin/ring-flash-attention's zigzag varlen
// scheme.
//
// Layout: each document of length L is padded at its end to P = multiple of 2cp (pads are
// loss-masked; causal attention keeps real tokens from seeing them); chunk size c = P/(2cp).
// Local rows, per document in order: global rows [r*c, (r+1)*c) then [(2cp-1-r)*c, (2cp-r)*c).
// RoPE needs the global positions (`positions`).
//
// Devices: CPU tensors (f32/f64) over the MPI or single communicator, and CUDA tensors (f32,
// bf16, f16, f64) over the NCCL communicator (or the single one at cp 1). One driver serves both:
// the attention blocks are kernels::attention_fwd/bwd, the row gathers, the log-sum-exp merge
// and the dK/dV scatter-adds between them are host loops on the CPU and the ring_*_cuda kernels
// below on CUDA. The CUDA path compiles and is reviewed but has NEVER RUN ON A GPU (its parity
// test, tests/kernels/test_ring_attention_cuda.cpp, skips without a device).
//
// Forward: step 0 is causal attention over the local rows; at step s >= 1 the KV of rank
// j = (r - s) mod cp has arrived around the ring: j < r -> all local queries against j's first
// halves, unmasked; j > r -> the local second halves against all of j's KV, unmasked. Partial
// results merge exactly through their log-sum-exp. Each step posts the KV exchange (group_start,
// send, recv into the second of two KV buffers) before it computes and closes the group after,
// so the transfer runs beside the compute: on NCCL the sends and receives run on the
// communicator's stream while the blocks run on the caller's; on MPI they are nonblocking calls
// completed at group_end.
//   q:[T,Hq,D], k/v:[T,Hk,D] local rows -> out:[T,Hq,D] (q's dtype), lse:[Hq,T] f32 (f64 for
//   f64), as kernels/attention.h
// The running out and lse are kept in f32 (f64 for f64) across the steps; with 16-bit input each
// block's out is 16-bit (the CUDA attention writes q's dtype), merged into the f32 running out,
// which is rounded to q's dtype once at the end.
//
// Backward (same step schedule): every block's gradient is the flash-attention backward with
// the FINAL out and lse (P = exp(S - lse), D = rowsum(dout * out)), so block contributions just
// add. dQ accumulates locally; the dK/dV of the visiting KV travel a second ring one step behind
// the KV (cp hops), so each rank ends with the complete dK/dV of its own rows. dQ and the
// travelling dK/dV accumulate in f32 (f64 for f64) and are rounded to q's dtype at the end (16-bit
// block gradients are 16-bit, as the CUDA attention writes them). The CPU path takes no 16-bit
// input (the CPU attention has none). Pad rows get zero gradients when their dout is zero (real
// tokens never attend to pads).
//
// The autograd entry keeps a pointer to `comm`: it must outlive the backward, and every rank
// of the ring must run the backward (it is collective).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/comm.h"
#include "kernels/attention.h"

namespace leantune::kernels {

struct ZigzagLayout {
  int cp = 1;
  int rank = 0;
  std::vector<int64_t> lengths;         // real length of each document
  std::vector<int64_t> padded_lengths;  // multiple of 2cp
  std::vector<int32_t> cu_seqlens_global;
  std::vector<int32_t> cu_seqlens_local;  // global / cp
  std::vector<int32_t> cu_seqlens_half;   // global / (2cp): one chunk per document
  std::vector<int64_t> global_rows;       // local row -> row in the padded global batch
  std::vector<int64_t> positions;         // local row -> position within its document
  std::vector<uint8_t> is_pad;            // local row -> 1 for padding
  int64_t local_rows() const { return static_cast<int64_t>(global_rows.size()); }
};

ZigzagLayout zigzag_layout(const std::vector<int64_t>& lengths, int cp, int rank);

// The rows of a padded global [Tg, ...] tensor that this rank holds, in local order.
Tensor zigzag_local_rows(const Tensor& global, const ZigzagLayout& layout);

AttentionOutput zigzag_ring_attention_fwd(Communicator& comm, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const ZigzagLayout& layout,
                                          double scale = 0.0);

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// dq:[T,Hq,D], dk/dv:[T,Hk,D] for this rank's rows, given the forward's out and lse and dout.
// Collective over `comm`.
AttentionGrads zigzag_ring_attention_bwd(Communicator& comm, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         const Tensor& dout, const ZigzagLayout& layout,
                                         double scale = 0.0);

// Differentiable w.r.t. q, k, v (out carries the node; lse carries no gradient).
AttentionOutput zigzag_ring_attention(Communicator& comm, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const ZigzagLayout& layout,
                                      double scale = 0.0);

// The ring's row helpers on CUDA (kernels/ring_attention.cu); every tensor contiguous on one CUDA
// device, row ids [n] i64 on it, distinct and in range (the driver builds them from the layout).
//   dst:[n,...] = src:[T,...][rows] (any dtype; 1-D src/dst gather single elements)
void ring_gather_cuda(const Tensor& src, const Tensor& rows, const Tensor& dst);
//   dst:[T,...] f32 (f64 for f64) += src:[n,...] at rows (undefined rows: rows 0..n-1)
void ring_add_rows_cuda(const Tensor& dst, const Tensor& rows, const Tensor& src);
//   out:[T,H,D] (f32/f64, or out_b's dtype) and lse:[H,T] f32 (f64) absorb the partial result
//   out_b:[n,H,D], lse_b:[H,n] at rows (undefined rows: n == T, row i is row i)
void ring_lse_merge_cuda(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                         const Tensor& lse_b, const Tensor& rows);

}  // namespace leantune::kernels
