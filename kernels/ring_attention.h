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
// unmasked. Partial results merge exactly through their log-sum-exp.
//   q:[T,Hq,D], k/v:[T,Hk,D] local rows -> out:[T,Hq,D], lse:[Hq,T] (as kernels/attention.h)
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

}  // namespace leantune::kernels
