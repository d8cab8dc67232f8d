// Which rows of a varlen attention tensor belong to no sequence, and where the CUDA fill kernel
// writes them (kernels/attention.cu), in one host-callable place so that a CPU test replays the
// fill exactly (tests/kernels/test_attention.cpp).
//   Rows [0, cu[0]) and [cu[B], T) (cu clamped into [0, T]) belong to no sequence; the tensor-core
//   kernels never visit them, so a fill kernel writes out = 0, lse = -inf, dk = dv = 0 there. A
//   host cu_seqlens is validated (cu[0] == 0); a device one with both max_seqlen hints is not
//   read back, so cu[0] > 0 must still give defined rows.
//   x is [rows, row_elems] contiguous, or with `transposed` [row_elems, rows] (lse's [H, T]).
#pragma once

#include <cstdint>

#include "engine/dtype.h"

namespace leantune::kernels {

struct UncoveredRows {
  int head_end;    // rows [0, head_end) precede the first sequence
  int tail_start;  // rows [tail_start, rows) follow the last one
  LT_HD int64_t count(int rows) const { return static_cast<int64_t>(head_end) + rows - tail_start; }
};

LT_HD UncoveredRows uncovered_rows(int cu_first, int cu_last, int rows) {
  const int head_end = cu_first < 0 ? 0 : (cu_first > rows ? rows : cu_first);
  int tail_start = cu_last < head_end ? head_end : cu_last;
  if (tail_start > rows) tail_start = rows;
  return {head_end, tail_start};
}

// Offset into x of element idx in [0, u.count(rows) * row_elems) of the fill.
LT_HD int64_t uncovered_offset(int64_t idx, UncoveredRows u, int rows, int64_t row_elems,
                               bool transposed) {
  const int64_t n_rows = u.count(rows);
  int64_t r, e;  // r-th uncovered row, element e within it
  if (transposed) {
    e = idx / n_rows;
    r = idx % n_rows;
  } else {
    r = idx / row_elems;
    e = idx % row_elems;
  }
  const int64_t row = r < u.head_end ? r : r - u.head_end + u.tail_start;
  return transposed ? e * rows + row : row * row_elems + e;
}

}  // namespace leantune::kernels
