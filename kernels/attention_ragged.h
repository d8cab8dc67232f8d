// The ragged ("THD") layout the cuDNN path hands cuDNN (kernels/attention_cudnn.cu), in one
// host-callable place so that a CPU test replays it exactly (tests/kernels/test_attention.cpp).
//   A packed batch of `batch` sequences, cu:[batch + 1] (on the device, not validated) over t
//   rows, becomes nb >= batch cuDNN entries (nb a power of two, so that graphs are reused across
//   batches). Entry b starts at row ragged_start and holds ragged_len rows, clipped to cap (the
//   bucketed longest sequence). cu is clamped into [0, t]; a decreasing cu gives length 0;
//   padding entries (b >= batch) start where the last sequence ends and hold nothing. So every
//   entry lies within [0, t]: whatever cu holds, cuDNN reads and writes no row outside the
//   operands.
#pragma once

#include <cstdint>

#include "engine/dtype.h"

namespace leantune::kernels {

// cu[min(i, batch)] clamped into [0, t].
LT_HD int64_t ragged_cu_at(const int32_t* cu, int i, int batch, int64_t t) {
  const int64_t c = cu[i < batch ? i : batch];
  return c < 0 ? 0 : (c > t ? t : c);
}

LT_HD int64_t ragged_start(const int32_t* cu, int b, int batch, int64_t t) {
  return ragged_cu_at(cu, b, batch, t);
}

LT_HD int64_t ragged_len(const int32_t* cu, int b, int batch, int64_t t, int64_t cap) {
  if (b >= batch) return 0;
  const int64_t len = ragged_cu_at(cu, b + 1, batch, t) - ragged_cu_at(cu, b, batch, t);
  return len < 0 ? 0 : (len > cap ? cap : len);
}

// Whether the batch can go to cuDNN as a dense [batch, H, S, D] graph (S = max_seqlen).
// `covered` is cu[batch], the rows the sequences cover, as checked on the host (cu[0] == 0), or
// -1 when the host has not read cu (a device cu_seqlens with max_seqlen hints). When max_seqlen
// bounds every sequence and the sequences cover all t rows, t == batch * max_seqlen holds exactly
// when every sequence has max_seqlen rows, starting at b * max_seqlen; rows past cu[batch] (no
// sequence's) would be read as one more sequence's, so such a batch, or an unread cu, stays
// ragged.
LT_HD bool dense_batch(int batch, int64_t t, int64_t max_seqlen, int64_t covered) {
  return batch > 0 && max_seqlen > 0 && covered == t &&
         t == static_cast<int64_t>(batch) * max_seqlen;
}

// The smallest power of two >= max(x, lo), lo a power of two: the bucket of a batch size, a
// longest sequence or a row count.
LT_HD int64_t pow2_bucket(int64_t x, int64_t lo) {
  int64_t p = lo;
  while (p < x) p <<= 1;
  return p;
}

}  // namespace leantune::kernels
