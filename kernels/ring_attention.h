// Zigzag ring attention (context parallelism) over a Communicator: the sequence dimension of a
// packed varlen batch is split over the `cp` ranks of a communicator, each rank holding chunks
// r and 2cp-1-r of every document, so causal work is balanced (rank r computes (r+1/2) +
// (2cp-1-r+1/2) = 2cp half-blocks). Following zhuzilin/ring-flash-attention's zigzag varlen
// scheme (see /work/shared/reference/distributed.md section 3).
//
// Layout: each document of length L is padded at its end to P = multiple of 2cp (pads are
// loss-masked; causal attention keeps real tokens from seeing them); chunk size c = P/(2cp).
// Local rows, per document in order: global rows [r*c, (r+1)*c) then [(2cp-1-r)*c, (2cp-r)*c).
// RoPE needs the global positions (`positions`).
//
// Forward (CPU, f32/f64): step 0 is causal attention over the local rows; at step s >= 1 the
// KV of rank j = (r - s) mod cp has arrived around the ring: j < r -> all local queries against
// j's first halves, unmasked; j > r -> the local second halves against all of j's KV,
// unmasked. Partial results merge exactly through their log-sum-exp. Each step posts the KV
// exchange before it computes, so the transfer runs beside the compute.
//   q:[T,Hq,D], k/v:[T,Hk,D] local rows -> out:[T,Hq,D], lse:[Hq,T] (as kernels/attention.h)
//
// Backward (same step schedule): every block's gradient is the flash-attention backward with
// the FINAL out and lse (P = exp(S - lse), D = rowsum(dout * out)), so block contributions just
// add. dQ accumulates locally; the dK/dV of the visiting KV travel a second ring one step behind
// the KV (cp hops), so each rank ends with the complete dK/dV of its own rows. Accumulation in
// the input dtype (f32 or f64; the CPU path takes no 16-bit input). Pad rows get zero gradients
// when their dout is zero (real tokens never attend to pads).
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

}  // namespace leantune::kernels
