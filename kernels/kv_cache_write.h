// kv_cache_write: scatters the new tokens' key or value rows into the slots of a paged KV-cache
// pool (models/kv_cache.h).
//   pool:[S,W] contiguous, any dtype; slots:[T] i32|i64 on the host; rows:[T,W] of the pool's
//   dtype and device (may be strided) -> pool[slots[t]] = rows[t]; other pool rows unchanged
// The generation engine keeps every layer's K and V in fixed-size blocks of one pool; each step
// writes its tokens' rows at the slots their block tables give, one launch per layer and side
// instead of one copy per token. Slots are host values because the engine builds them there: a
// slot outside [0, S), or a slot named twice (which would make the result depend on write order),
// is an Error(kInput) naming the position, found before anything is written. No autograd:
// generation runs without gradients. Scratch: a contiguous copy of strided rows (kWorkspace), and
// on CUDA the slots uploaded (kWorkspace).
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace leantune::kernels {

void kv_cache_write(const Tensor& pool, const Tensor& slots, const Tensor& rows);

void kv_cache_write_cuda(const Tensor& pool, const Tensor& slots, const Tensor& rows);

// The checks both paths make: shapes, dtypes, and the slots' range and distinctness. Returns the
// slots as host int64 values.
std::vector<int64_t> kv_cache_checked_slots(const Tensor& pool, const Tensor& slots,
                                            const Tensor& rows, const char* op);

}  // namespace leantune::kernels
