// Philox fills (uniform, normal, bernoulli) on the host, and their device dispatch (see rng.h).
#include "engine/rng.h"

#include <cmath>

#include "engine/cpu_kernels.h"

namespace leantune {

double sqrt_host(double x) { return std::sqrt(x); }

namespace {
thread_local const RowTileDraws* t_row_tile = nullptr;
}  // namespace

const RowTileDraws* current_row_tile_draws() { return t_row_tile; }

RowTileDrawsScope::RowTileDrawsScope(const RowTileDraws& d) : d_(d), prev_(t_row_tile) {
  t_row_tile = &d_;
}
RowTileDrawsScope::~RowTileDrawsScope() { t_row_tile = prev_; }

PhiloxParams Generator::take_rows(int64_t n, const RowTileDraws& tile) {
  LT_CHECK(tile.rows > 0 && n % tile.rows == 0, "a random draw of ", n,
           " values inside a row-tiled block of ", tile.rows, " rows is not row-shaped");
  const int64_t cols = n / tile.rows;
  LT_CHECK((tile.row0 * cols) % 4 == 0, "row-tiled draw: block start ", tile.row0, " x ", cols,
           " columns is not a multiple of 4 values");
  PhiloxParams p{seed_, offset_ + static_cast<uint64_t>(tile.row0 * cols / 4), purpose_, rank_};
  offset_ += static_cast<uint64_t>((tile.rows_total * cols + 3) / 4);
  return p;
}

uint64_t Generator::next_below(uint64_t n) {
  LT_CHECK(n > 0, "next_below(0)");
  PhiloxBlock b = next_block();
  const uint64_t v = (static_cast<uint64_t>(b.w[0]) << 32) | b.w[1];
  return v % n;
}

namespace {
// kind 0: uniform in [a, b); 1: normal(a, b); 2: bernoulli(a).
void cpu_fill(const Tensor& t, const PhiloxParams& p, int kind, double a, double b) {
  LT_CHECK(t.is_contiguous(), "random fill of non-contiguous ", t.str());
  const int64_t n = t.numel();
  const int64_t blocks = (n + 3) / 4;
  const double b_minus_a = b - a;
  LT_DISPATCH_FLOAT(t.dtype(), T, {
    T* out = static_cast<T*>(t.data_ptr());
    cpu::parallel_for(blocks, 1024, [&](int64_t blk) {
      const PhiloxBlock r = philox_block(p, static_cast<uint64_t>(blk));
      for (int j = 0; j < 4; ++j) {
        const int64_t i = blk * 4 + j;
        if (i >= n) break;
        const double v = philox_fill_value(r, j, kind, a, b_minus_a, b);
        out[i] = cpu::from_double<T>(v);
      }
    });
  });
}

void fill(const Tensor& t, Generator& gen, int kind, double a, double b) {
  const PhiloxParams p = gen.take(t.numel());
  if (t.numel() == 0) return;
  if (t.device().is_cuda())
    cuda_ops::philox_fill(t, p, kind, a, b);
  else
    cpu_fill(t, p, kind, a, b);
}
}  // namespace

void uniform_(const Tensor& t, Generator& gen, double lo, double hi) { fill(t, gen, 0, lo, hi); }
void normal_(const Tensor& t, Generator& gen, double mean, double std) {
  fill(t, gen, 1, mean, std);
}
void bernoulli_(const Tensor& t, Generator& gen, double p) { fill(t, gen, 2, p, 0.0); }

}  // namespace leantune
