// The block size of weight gradients handed out by rows (see weight_grad_sink.h).
#include "kernels/weight_grad_sink.h"

#include <algorithm>
#include <numeric>

#include "engine/check.h"

namespace leantune::kernels {

int64_t weight_grad_block_rows(int64_t h) {
  LT_CHECK(h > 0, "weight_grad_block_rows: row length ", h);
  const int64_t align = 256 / std::gcd<int64_t>(h, 256);
  const int64_t rows = std::max<int64_t>(1, (int64_t{8} << 20) / h);
  return std::max(align, rows / align * align);
}

}  // namespace leantune::kernels
