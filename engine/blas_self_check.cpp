// See blas_self_check.h. The tolerance is the classical bound on a k-term dot product's rounding
// error, a small multiple of k * eps * sum |alpha a_i b_i| (+ |beta c|), so that any correct
// kernel, whatever its summation order, passes, and a wrong one (errors of the inputs' order)
// fails.
#include "engine/blas_self_check.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

namespace leantune {

namespace {

struct Shape {
  int m, n, k;
  bool ta, tb;
};
// Odd sizes straddle the kernels' register blocks (4 to 32 rows/columns); a single row and a
// single column take OpenBLAS's GEMV-like paths.
constexpr Shape kShapes[] = {{61, 47, 83, false, true},  {33, 65, 17, true, false},
                             {7, 129, 64, false, false}, {64, 1, 97, true, true},
                             {1, 31, 257, false, true},  {48, 48, 48, true, true}};

void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, n);
}
void gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda,
          const double* b, int ldb, double beta, double* c) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, n);
}

// Deterministic values in [-1, 1).
double value(uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0;
}

template <typename T>
std::string check_shape(const char* name, const Shape& s, bool perturb) {
  const int m = s.m, n = s.n, k = s.k;
  // Row-major op(A) is m x k: A is stored k x m when transposed.
  const int lda = s.ta ? m : k, ldb = s.tb ? k : n;
  std::vector<T> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n),
      c(static_cast<size_t>(m) * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<T>(value(i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<T>(value(i + 7919));
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<T>(value(i + 104729));
  const std::vector<T> c0 = c;
  const T alpha = static_cast<T>(0.75), beta = static_cast<T>(-0.5);
  gemm(s.ta, s.tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data());
  if (perturb) c[static_cast<size_t>(m / 2) * n + n / 2] += static_cast<T>(1);
  const double eps = std::numeric_limits<T>::epsilon();
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double ref = 0, scale = 0;
      for (int p = 0; p < k; ++p) {
        const double x =
            s.ta ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p];
        const double y =
            s.tb ? b[static_cast<size_t>(j) * ldb + p] : b[static_cast<size_t>(p) * ldb + j];
        ref += x * y;
        scale += std::fabs(x * y);
      }
      const double c_in = c0[static_cast<size_t>(i) * n + j];
      ref = alpha * ref + beta * c_in;
      scale = std::fabs(alpha) * scale + std::fabs(beta * c_in);
      const double got = c[static_cast<size_t>(i) * n + j];
      const double tol = 4.0 * (k + 2) * eps * scale + 1e-30;
      if (!(std::fabs(got - ref) <= tol)) {
        char msg[200];
        std::snprintf(msg, sizeof msg,
                      "%s %dx%dx%d %s %s: C[%d,%d] is %.6g where a naive loop "
                      "gives %.6g",
                      name, m, n, k, s.ta ? "A^T" : "A", s.tb ? "B^T" : "B", i, j, got, ref);
        return msg;
      }
    }
  }
  return "";
}

}  // namespace

std::string blas_self_check(bool perturb) {
  bool first = true;
  for (const Shape& s : kShapes) {
    std::string r = check_shape<float>("sgemm", s, perturb && first);
    first = false;
    if (r.empty()) r = check_shape<double>("dgemm", s, false);
    if (!r.empty()) return r;
  }
  return "";
}

}  // namespace leantune
