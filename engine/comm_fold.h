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

// Whether the communicators can move a dtype (all_gather, broadcast, send, recv: the bytes travel
// unchanged): the types they can reduce, and the byte-sized and unsigned integer types that
// quantized weights and their state use (NCCL has a type of each width).
bool comm_dtype_movable(DType dtype);
// Whether they can reduce it (all_reduce, reduce_scatter): the types fold_rank_order sums, as
// the NCCL fold kernel does (f32, f64, bf16, f16, i32, i64).
bool comm_dtype_reducible(DType dtype);
// What a collective does with the bytes: moves them (all_gather, broadcast, send, recv) or sums
// them (all_reduce, reduce_scatter and their variants).
enum class CommUse : uint8_t { kMove, kReduce };
// Error(kInternal) "comm <what>: unsupported dtype ..." unless `use` can take dtype.
void check_comm_dtype(DType dtype, const char* what, CommUse use);

// The block rules every backend checks: a reduce_scatter's `in` holds `size` blocks of `out`,
// an all_gather's `out` holds `size` blocks of `in`, in one dtype (Error naming `what`).
void check_scatter_blocks(const Tensor& in, const Tensor& out, int size, const char* what);
void check_gather_blocks(const Tensor& in, const Tensor& out, int size, const char* what);

const char* reduce_op_name(ReduceOp op);

}  // namespace leantune::comm_detail
