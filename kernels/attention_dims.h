// The sizes of one attention call, and the shape, dtype and cu_seqlens checks the CPU and CUDA
// paths share:
//   q:[Tq,Hq,D], k and v:[Tk,Hk,D], D > 0, Hk > 0, Hq % Hk == 0 (group = Hq / Hk query heads
//   per KV head), q, k and v of one float dtype.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

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

// cu_seqlens_q and cu_seqlens_k as read to the host, checked as both paths check them: each runs
// from 0 to at most its rows (tq, tk) without decreasing, and a non-zero total_seqlen hint is
// where both end. Returns the longest query and key sequences.
inline std::pair<int64_t, int64_t> check_cu_seqlens(const char* op, const std::vector<int64_t>& cq,
                                                    const std::vector<int64_t>& ck, int64_t tq,
                                                    int64_t tk, int64_t total_hint) {
  const size_t batch = cq.size() - 1;
  for (const auto* cu : {&cq, &ck}) {
    const int64_t total = cu == &cq ? tq : tk;
    LT_CHECK(cu->front() == 0 && cu->back() <= total, op, ": cu_seqlens run from ", cu->front(),
             " to ", cu->back(), " for ", total, " rows");
    for (size_t b = 0; b < batch; ++b)
      LT_CHECK((*cu)[b] <= (*cu)[b + 1], op, ": cu_seqlens decrease at ", b, ": ", (*cu)[b], " > ",
               (*cu)[b + 1]);
  }
  LT_CHECK(total_hint == 0 || (cq.back() == total_hint && ck.back() == total_hint), op,
           ": total_seqlen ", total_hint, " but cu_seqlens end at ", cq.back(), " and ", ck.back());
  int64_t mq = 0, mk = 0;
  for (size_t b = 0; b < batch; ++b) {
    mq = std::max(mq, cq[b + 1] - cq[b]);
    mk = std::max(mk, ck[b + 1] - ck[b]);
  }
  return {mq, mk};
}

}  // namespace leantune::kernels
