// Attention in the input dtype as PyTorch runs it for 16-bit inputs (flash-attention's
// attention_ref without upcast), the "naive" yardstick of flash-attention's rule for the varlen
// attention and the ring attention rows of the table:
//   qs = r(q * scale); S = r(qs K^T), masked; A = r(softmax(S)) (0 for rows that see nothing);
//   O = r(A V). Backward: dA = r(dO V^T); dS = r(A (dA - rowsum(dA A))); dq = r(r(dS K) scale);
//   dK_h = r(dS^T qs), dV_h = r(A^T dO); dK, dV = r(sum over the GQA group of dK_h, dV_h),
// with r() the rounding to `dt` and every sum in double.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace leantune::backend_test {

struct NaiveAttention {
  std::vector<double> out, dq, dk, dv;  // [T, H, D] row-major, like the tensors
};

// q, dout: [Tq, Hq, D]; k, v: [Tk, Hk, D] (host, dtype dt); cq/ck the cu_seqlens; causal masks
// bottom-right aligned (row i of a sequence sees keys j <= i + Lk - Lq). Rows outside every
// sequence stay 0.
NaiveAttention naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& dout, const std::vector<int64_t>& cq,
                               const std::vector<int64_t>& ck, bool causal, DType dt);

}  // namespace leantune::backend_test
