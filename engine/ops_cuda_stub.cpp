// CPU-only build: CUDA tensors cannot exist, but engine/ops.cpp and engine/rng.cpp still link
// against the cuda_ops entry points; these report that the build has no CUDA backend. In CUDA
// builds engine/ops_cuda.cu and engine/rng.cu provide them and this file compiles to nothing.
#ifndef LEANTUNE_WITH_CUDA
#include "engine/ops_cuda.h"
#include "engine/rng.h"

namespace leantune::cuda_ops {
namespace {
[[noreturn]] void missing(const char* op) { LT_THROW_NO_CUDA(op); }
}  // namespace
void copy(const Tensor&, const Tensor&) { missing("copy"); }
void fill(const Tensor&, double) { missing("fill"); }
Tensor add(const Tensor&, const Tensor&, double) { missing("add"); }
void add_(const Tensor&, const Tensor&, double) { missing("add_"); }
Tensor mul(const Tensor&, const Tensor&) { missing("mul"); }
void mul_(const Tensor&, const Tensor&) { missing("mul_"); }
Tensor div(const Tensor&, const Tensor&) { missing("div"); }
Tensor affine(const Tensor&, double, double) { missing("affine"); }
void scale_(const Tensor&, double) { missing("scale_"); }
Tensor unary(const Tensor&, ops::Unary) { missing("unary"); }
Tensor sum(const Tensor&) { missing("sum"); }
Tensor sum_dim(const Tensor&, int64_t, bool) { missing("sum_dim"); }
Tensor max_last(const Tensor&) { missing("max_last"); }
Tensor argmax_last(const Tensor&) { missing("argmax_last"); }
double sum_squares(const Tensor&) { missing("sum_squares"); }
double max_abs(const Tensor&) { missing("max_abs"); }
bool all_finite(const Tensor&) { missing("all_finite"); }
void gemm(const Tensor&, bool, const Tensor&, bool, const Tensor&, double, double) {
  missing("gemm");
}
Tensor softmax_last(const Tensor&, bool) { missing("softmax_last"); }
Tensor index_rows(const Tensor&, const Tensor&) { missing("index_rows"); }
void philox_fill(const Tensor&, const PhiloxParams&, int, double, double) {
  missing("random fill");
}
}  // namespace leantune::cuda_ops
#endif  // LEANTUNE_WITH_CUDA
