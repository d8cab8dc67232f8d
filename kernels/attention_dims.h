// The sizes of one attention call, and the shape and dtype checks the CPU and CUDA paths share:
//   q:[Tq,Hq,D], k and v:[Tk,Hk,D], D > 0, Hk > 0, Hq % Hk == 0 (group = Hq / Hk query heads
//   per KV head), q, k and v of one float dtype.
#pragma once

#include <cstdint>

#include "engine/check.h"
#include "engine/tensor.h"

namespace leantune::kernels {

struct AttentionDims {
  int64_t tq, tk, hq, hk, d, group;
};

inline AttentionDims check_qkv_shapes(const char* op, const Tensor& q, const Tensor& k,
                                      const Tensor& v) {
  LT_CHECK(q.dim() == 3 && k.dim() == 3 && v.shape() == k.shape() && q.size(2) == k.size(2) &&
               q.size(2) > 0 && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
           op, ": q ", q.str(), ", k ", k.str(), ", v ", v.str(),
           " (want q [Tq,Hq,D], k and v [Tk,Hk,D], Hq % Hk == 0)");
  LT_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && dtype_is_floating(q.dtype()), op,
           ": q ", q.str(), ", k ", k.str(), ", v ", v.str(), " need one float dtype");
  return {q.size(0), k.size(0), q.size(1), k.size(1), q.size(2), q.size(1) / k.size(1)};
}

}  // namespace leantune::kernels
