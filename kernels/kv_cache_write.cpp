// kv_cache_write on the CPU: pool[slots[t]] = rows[t], row by row with memcpy (rows are bytes to
// this op: no dtype conversion, so every dtype, quantised or not, is moved exactly). Parallel over
// the rows; the slots are distinct, so no two threads write the same row.
#include "kernels/kv_cache_write.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/ops.h"

namespace leantune::kernels {

std::vector<int64_t> kv_cache_checked_slots(const Tensor& pool, const Tensor& slots,
                                            const Tensor& rows, const char* op) {
  LT_CHECK(pool.dim() == 2 && pool.is_contiguous(), op, ": pool ", pool.str(),
           " must be a contiguous 2-D tensor");
  LT_CHECK(slots.dim() == 1 && (slots.dtype() == DType::kI32 || slots.dtype() == DType::kI64) &&
               slots.device().is_cpu(),
           op, ": slots ", slots.str(), " must be 1-D i32 or i64 on the host");
  const int64_t t = slots.size(0);
  LT_CHECK(rows.dim() == 2 && rows.size(0) == t && rows.size(1) == pool.size(1) &&
               rows.dtype() == pool.dtype() && rows.device() == pool.device(),
           op, ": rows ", rows.str(), " for pool ", pool.str(), " and ", t, " slots");
  std::vector<int64_t> s = slots.to_i64();
  const int64_t n = pool.size(0);
  for (int64_t i = 0; i < t; ++i)
    LT_CHECK_INPUT(s[i] >= 0 && s[i] < n, op, ": slot ", s[i], " at position ", i,
                   " is outside the pool's [0, ", n, ")");
  std::vector<int64_t> sorted = s;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    const int64_t first = std::find(s.begin(), s.end(), *dup) - s.begin();
    const int64_t second = std::find(s.begin() + first + 1, s.end(), *dup) - s.begin();
    LT_THROW(ErrorKind::kInput, op, ": slot ", *dup, " is named at positions ", first, " and ",
             second);
  }
  return s;
}

void kv_cache_write(const Tensor& pool, const Tensor& slots, const Tensor& rows) {
  const char* op = "kv_cache_write";
  if (pool.device().is_cuda()) {
    kv_cache_write_cuda(pool, slots, rows);
    return;
  }
  const std::vector<int64_t> s = kv_cache_checked_slots(pool, slots, rows, op);
  if (s.empty() || pool.size(1) == 0) return;
  const Tensor rc = ops::contiguous_workspace(rows);
  const size_t row_bytes = static_cast<size_t>(pool.size(1)) * pool.element_size();
  auto* dst = static_cast<char*>(pool.data_ptr());
  const auto* src = static_cast<const char*>(rc.data_ptr());
  cpu::parallel_for(static_cast<int64_t>(s.size()), cpu::grain_for(pool.size(1)), [&](int64_t i) {
    std::memcpy(dst + static_cast<size_t>(s[i]) * row_bytes,
                src + static_cast<size_t>(i) * row_bytes, row_bytes);
  });
}

}  // namespace leantune::kernels
