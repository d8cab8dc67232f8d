// The one GEMM call of the CUDA kernels (linear, linear_cross_entropy), host side:
//   column-major D[m,n] (ld ldd) = alpha op(A) op(B) + beta D (+ bias[m] in the epilogue),
//   A, B of dtype `in` with leading dimensions lda, ldb; D of dtype `out`.
// f64 goes through cublasDgemm, every other dtype through cuBLASLt (engine/cuda_blas.cuh says
// how each accumulates).
#pragma once

#include "engine/cuda_blas.cuh"

namespace leantune::kernels {

inline void gemm_cm(const void* a, int64_t lda, bool ta, const void* b, int64_t ldb, bool tb,
                    void* d, int64_t ldd, int64_t m, int64_t n, int64_t k, double alpha,
                    double beta, DType in, DType out, const void* bias, Device dev,
                    cudaStream_t stream) {
  cu::LtGemm g;
  g.a = a;
  g.a_type = cu::cuda_data_type(in);
  g.lda = lda;
  g.trans_a = ta;
  g.b = b;
  g.b_type = g.a_type;
  g.ldb = ldb;
  g.trans_b = tb;
  g.d = d;
  g.d_type = cu::cuda_data_type(out);
  g.ldd = ldd;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = alpha;
  g.beta = beta;
  g.bias = bias;
  if (in == DType::kF64)
    cu::dgemm(g, dev, stream);
  else
    cu::lt_gemm(g, dev, stream);
}

}  // namespace leantune::kernels
