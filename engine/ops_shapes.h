// Operand checks and output shapes of the raw ops (engine/ops.h), shared by the CPU ops
// (engine/ops.cpp) and the CUDA ops (engine/ops_cuda_*.cu): both backends accept the same
// operands, refuse the others with the same message, and give the same output shapes.
//   broadcast_kind    a binary op's b against a: equal shapes, one element, or a's trailing dims.
//   binary_operands   a binary op's checks and operand conversions.
//   dim_reduction     x seen as [outer, n, inner] around the reduced dimension (sum_dim).
//   last_dim_rows     x seen as [rows, n] (max_last, argmax_last); the output drops the last dim.
//   gemm_dims         m, k, n of c[m, n] = op(a)[m, k] @ op(b)[k, n], all 2-D.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/tensor.h"

namespace leantune::ops {

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  LT_CHECK(a.device() == b.device(), op, ": tensors on ", a.device().str(), " and ",
           b.device().str());
}

// How b broadcasts against a. The CUDA kernels take it as an argument.
enum class Bcast : int { kSame = 0, kScalar = 1, kRow = 2 };

inline Bcast broadcast_kind(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() == b.shape()) return Bcast::kSame;
  if (b.numel() == 1) return Bcast::kScalar;
  const auto& as = a.shape();
  const auto& bs = b.shape();
  if (bs.size() <= as.size() && std::equal(bs.begin(), bs.end(), as.end() - bs.size()))
    return Bcast::kRow;
  LT_THROW(ErrorKind::kInternal, op, ": shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()), " do not match");
}

// A binary op's operands made ready: a contiguous (in place, it must already be), b converted to
// a's dtype and contiguous, and how b broadcasts against a.
struct BinaryOperands {
  Tensor a;
  Tensor b;
  Bcast kind;
};

inline BinaryOperands binary_operands(const Tensor& a, const Tensor& b, const char* op,
                                      bool in_place) {
  check_same_device(a, b, op);
  if (in_place) LT_CHECK(a.is_contiguous(), op, " in place on non-contiguous ", a.str());
  BinaryOperands r;
  r.a = a.is_contiguous() ? a : a.contiguous();
  r.b = b.dtype() == a.dtype() ? b : b.to(a.dtype());
  if (!r.b.is_contiguous()) r.b = r.b.contiguous();
  r.kind = broadcast_kind(r.a, r.b, op);
  return r;
}

// A reduction over one dimension: x is [outer, n, inner] with n the reduced size; `shape` is the
// output's (the dimension kept as 1 or dropped).
struct DimReduction {
  int64_t outer = 1;
  int64_t n = 0;
  int64_t inner = 1;
  Shape shape;
};

inline DimReduction dim_reduction(const Tensor& x, int64_t dim, bool keepdim, const char* op) {
  const int64_t nd = x.dim();
  if (dim < 0) dim += nd;
  LT_CHECK(dim >= 0 && dim < nd, op, ": dim out of range for ", x.str());
  DimReduction r;
  r.n = x.shape()[dim];
  for (int64_t i = 0; i < dim; ++i) r.outer *= x.shape()[i];
  for (int64_t i = dim + 1; i < nd; ++i) r.inner *= x.shape()[i];
  r.shape = x.shape();
  if (keepdim)
    r.shape[dim] = 1;
  else
    r.shape.erase(r.shape.begin() + dim);
  return r;
}

// A reduction over the last dimension: x is [rows, n]; `shape` is x's without its last dim.
struct LastDimRows {
  int64_t rows = 0;
  int64_t n = 0;
  Shape shape;
};

inline LastDimRows last_dim_rows(const Tensor& x) {
  LastDimRows r;
  r.n = x.size(-1);
  r.rows = x.numel() / std::max<int64_t>(r.n, 1);
  r.shape.assign(x.shape().begin(), x.shape().end() - 1);
  return r;
}

struct GemmDims {
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
};

inline GemmDims gemm_dims(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
  LT_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "gemm needs 2-D tensors: ", a.str(), ", ",
           b.str(), ", ", c.str());
  GemmDims g;
  g.m = ta ? a.size(1) : a.size(0);
  g.k = ta ? a.size(0) : a.size(1);
  const int64_t kb = tb ? b.size(1) : b.size(0);
  g.n = tb ? b.size(0) : b.size(1);
  LT_CHECK(g.k == kb && c.size(0) == g.m && c.size(1) == g.n, "gemm shapes: op(a) ", g.m, "x", g.k,
           ", op(b) ", kb, "x", g.n, ", c ", shape_str(c.shape()));
  return g;
}

}  // namespace leantune::ops
