// Raw tensor math used by the engine, the trainers and the tests: no autograd. Inputs may be
// on the host or on a CUDA device (both operands on the same device). Float ops accept f32,
// f64, bf16 and f16 and compute in f32 (f64 for f64 inputs); outputs take the input dtype unless
// stated; outputs carry current_mem_tag(). Binary ops take equal shapes, or a `b` with one element
// (a scalar), or a `b` whose shape equals the trailing dimensions of `a` (a row broadcast, as for a
// bias).
#pragma once

#include "engine/scope_guard.h"
#include "engine/tensor.h"

namespace leantune::ops {

// dst = src, converting dtype and crossing devices; either side may be strided.
void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& t, double value);

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
void add_(const Tensor& a, const Tensor& b, double alpha = 1.0);   // a += alpha * b
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
void mul_(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, double s);
void scale_(const Tensor& a, double s);
// a * alpha + beta, elementwise.
Tensor affine(const Tensor& a, double alpha, double beta);

enum class Unary {
  kNeg,
  kExp,
  kLog,
  kSigmoid,
  kLogSigmoid,
  kTanh,
  kRelu,
  kSquare,
  kSqrt,
  kAbs,
  kSilu
};
Tensor unary(const Tensor& x, Unary op);

// Sum of all elements as a one-element tensor (f32, or f64 for f64 input); accumulates in
// double on the host.
Tensor sum(const Tensor& x);
// Sum over one dimension.
Tensor sum_dim(const Tensor& x, int64_t dim, bool keepdim = false);
// Max and argmax over the last dimension.
Tensor max_last(const Tensor& x);
Tensor argmax_last(const Tensor& x);  // i64
// Host scalars (these synchronise on CUDA).
double sum_squares(const Tensor& x);
double max_abs(const Tensor& x);
bool all_finite(const Tensor& x);

// c = alpha * op(a) @ op(b) + beta * c, with op = transpose when the flag is set. a, b, c are
// 2-D and contiguous. 16-bit inputs are upcast; accumulation is f32 (f64 for f64).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          double alpha = 1.0, double beta = 0.0);
// Batch invariance (CPU): OpenBLAS picks its kernel by the product's size (a single row, and
// products under about a million multiply-adds, take other paths that round differently), so a
// row of op(a) @ op(b) may change in its last bits with the number of rows beside it. Under this
// guard (per thread) the CPU gemm computes op(a) in tiles of exactly kBatchInvariantRows rows
// (the last one padded), so that every row's bits depend only on the row itself: generation
// samples the same tokens for a prompt in any batch. Training does not need it and runs whole
// products.
inline constexpr int64_t kBatchInvariantRows = 16;
class BatchInvariantGemmGuard : ScopeGuard {
 public:
  BatchInvariantGemmGuard();
  ~BatchInvariantGemmGuard();

 private:
  bool prev_;
};
// op(a) @ op(b) with a fresh output of a's dtype.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              MemTag tag = current_mem_tag());

// Softmax / log-softmax over the last dimension, computed in f32 (f64 for f64).
Tensor softmax_last(const Tensor& x);
Tensor log_softmax_last(const Tensor& x);

// `t` itself when contiguous, else a contiguous copy tagged kWorkspace (an op's scratch).
Tensor contiguous_workspace(const Tensor& t);

// Gathers rows: out[i] = table[ids[i]] for a 2-D table and 1-D i32/i64 ids.
Tensor index_rows(const Tensor& table, const Tensor& ids);

}  // namespace leantune::ops
