// A quick check of the loaded BLAS kernels before leantune trusts a family it forced: a few
// sgemm and dgemm products of odd sizes, every transpose combination, alpha and beta not 1 and
// 0, each compared with a naive loop accumulated in double. Older OpenBLAS builds are known to
// miscompute with some kernel families on some CPUs; a family that fails here is not used.
//
// The products are small (under OpenBLAS's threading threshold): one GEMM buffer, one thread,
// well under a millisecond in all.
#pragma once

#include <string>

namespace leantune {

// "" when every product matches; else the first mismatch, e.g. "sgemm 61x47x83 A B^T: C[12,30]
// is 0.518 where a naive loop gives 1.204". perturb: add 1 to one element of the first product
// before comparing (LEANTUNE_BLAS_SIMULATE_MISMATCH, so that tests reach the fallback).
std::string blas_self_check(bool perturb = false);

}  // namespace leantune
