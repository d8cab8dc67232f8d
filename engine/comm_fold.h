// Rank-order folds shared by the communicator backends.
//
// A deterministic reduction receives every rank's contribution to a block (in:[N, n] in the
// tensor's dtype, row r = rank r's values) and folds them in rank order, in f32 for f32/bf16/f16
// (one rounding to 16 bits at the end), f64 for f64 and int64 for the integer types:
//   out[i] = op(... op(op(in[0][i], in[1][i]), in[2][i]) ..., in[N-1][i])
// so the result depends only on the contributions and their order, never on the transport's
// reduction tree. kAvg is the sum divided by N (floating types only).
#pragma once

#include <cstdint>

#include "engine/comm.h"
#include "engine/dtype.h"

namespace leantune::comm_detail {

// in: N rows of n elements of dtype, contiguous; out: n elements of dtype (may not alias in).
void fold_rank_order(const void* in, int64_t num_ranks, int64_t n, DType dtype, ReduceOp op,
                     void* out);

// Whether a dtype can travel through the communicators (float and integer types).
bool comm_dtype_supported(DType dtype);

const char* reduce_op_name(ReduceOp op);

}  // namespace leantune::comm_detail
