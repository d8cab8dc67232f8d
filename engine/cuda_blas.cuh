// cuBLASLt / cuBLAS entry points shared by engine/ops_cuda_blas.cu (gemm) and the kernels' GEMMs,
// and the deterministic column reduction used for bias and norm-weight gradients. Implemented
// in engine/ops_cuda_blas.cu.
//
// Everything here is column-major, as cuBLAS is: D[m,n] = alpha * op(A)[m,k] * op(B)[k,n]
// + beta * C, with C == D (in-place accumulation when beta != 0), optionally + bias[m]
// broadcast over the n columns. A row-major product is the same call on the transposes.
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>

#include "engine/device.h"
#include "engine/dtype.h"

namespace leantune::cu {

struct LtGemm {
  const void* a = nullptr;
  cudaDataType_t a_type = CUDA_R_32F;
  int64_t lda = 0;
  bool trans_a = false;
  const void* b = nullptr;
  cudaDataType_t b_type = CUDA_R_32F;
  int64_t ldb = 0;
  bool trans_b = false;
  void* d = nullptr;  // also C
  cudaDataType_t d_type = CUDA_R_32F;
  int64_t ldd = 0;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1.0;
  double beta = 0.0;
  const void* bias = nullptr;  // [m], D's dtype; nullptr = no bias epilogue
};

// cudaDataType_t of a float dtype (f32, f64, bf16, f16).
cudaDataType_t cuda_data_type(DType dt);

// lt_gemm's rank that asks for the autotuned choice (engine/gemm_tuning.h).
inline constexpr int kLtAutoRank = -1;
// How many of cuBLASLt's heuristic candidates the autotune times (those whose workspace fits
// the 32 MiB limit); explicit ranks index the same list.
inline constexpr int kLtTuneCandidates = 16;

// Runs the product with cuBLASLt's heuristic algorithm number `rank` (0 = its first choice; the
// heuristic is queried once per problem and cached), or with the autotuned one (kLtAutoRank:
// on the problem's first use its candidates are timed on `stream`, unless the stream is
// capturing a graph or LEANTUNE_GEMM_AUTOTUNE=0; then rank 0). f32 inputs compute in strict
// f32 (no TF32), 16-bit inputs accumulate in f32, f64 in f64. Workspace (at most 32 MiB) comes
// from the caching allocator on the current stream of `dev`. Throws when cuBLASLt has no
// algorithm.
void lt_gemm(const LtGemm& g, Device dev, cudaStream_t stream, int rank = kLtAutoRank);
// How many heuristic algorithms cuBLASLt offers for the problem, up to `max` (benchmarks time
// each of them to find the best).
int lt_gemm_algo_count(const LtGemm& g, Device dev, int max);
// The rank lt_gemm(g, dev, stream) runs: the autotuned choice (tuning on `stream` when the
// problem is new; with beta == 0 the timing writes g.d), or 0 without tuning. Benchmarks
// report it.
int lt_gemm_tuned_rank(const LtGemm& g, Device dev, cudaStream_t stream);

// f64 through cublasDgemm (column-major, same meaning as LtGemm without bias).
void dgemm(const LtGemm& g, Device dev, cudaStream_t stream);

// The product of `g` through the path its dtype takes: f64 through dgemm, every other float dtype
// through cuBLASLt with the autotuned algorithm (the one GEMM call of ops::gemm, kernels/linear.cu
// and kernels/linear_cross_entropy.cu).
inline void gemm(const LtGemm& g, Device dev, cudaStream_t stream) {
  if (g.a_type == CUDA_R_64F)
    dgemm(g, dev, stream);
  else
    lt_gemm(g, dev, stream);
}

// gemm on column-major D[m,n] (ld ldd) = alpha op(A) op(B) + beta D (+ bias[m]): A and B of dtype
// `in` (leading dimensions lda, ldb), D of dtype `out`.
inline void gemm_cm(const void* a, int64_t lda, bool ta, const void* b, int64_t ldb, bool tb,
                    void* d, int64_t ldd, int64_t m, int64_t n, int64_t k, double alpha,
                    double beta, DType in, DType out, const void* bias, Device dev,
                    cudaStream_t stream) {
  LtGemm g;
  g.a = a;
  g.a_type = cuda_data_type(in);
  g.lda = lda;
  g.trans_a = ta;
  g.b = b;
  g.b_type = g.a_type;
  g.ldb = ldb;
  g.trans_b = tb;
  g.d = d;
  g.d_type = cuda_data_type(out);
  g.ldd = ldd;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = alpha;
  g.beta = beta;
  g.bias = bias;
  gemm(g, dev, stream);
}

// out[c] = sum over r of x[r * ld + c] for c < cols, in a fixed order (deterministic),
// accumulated in f32 (f64 for f64 x). x: float dtype `x_type`; out: any float dtype (f64 only
// with f64 x), rounded once. Split over rows into f32 partials when the columns alone cannot fill
// the device; the partials come from the caching allocator.
void column_sum(const void* x, DType x_type, int64_t rows, int64_t cols, int64_t ld, void* out,
                DType out_type, Device dev, cudaStream_t stream);

}  // namespace leantune::cu
