// Counter-based random numbers (Philox-4x32-10, engine/philox.h), bit-identical on the host
// and on CUDA. A Generator is (seed, purpose, rank) plus an offset in 128-bit blocks that each
// draw advances by ceil(n/4); saving and restoring the offset replays a stream exactly.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/autograd.h"
#include "engine/philox.h"
#include "engine/scope_guard.h"
#include "engine/tensor.h"

namespace leantune {

// Independent streams for independent uses, so that enabling one feature never shifts the
// random numbers of another.
enum class RngPurpose : uint32_t {
  kInit = 1,
  kDropout = 2,
  kDataOrder = 3,
  kSampling = 4,
  kLoraInit = 5,
  kTest = 100,
};

// The rows of a row-tiled region (engine/tiled.h) that the current computation covers: rows
// [row0, row0 + rows) of rows_total. Inside such a scope a generator's draw of n = rows x cols
// values yields the coordinates that the untiled draw of rows_total x cols values gives those
// rows (row0 x cols must be a multiple of 4) and advances the generator as that draw does, so a
// tiled region draws the masks of the untiled one, whatever its blocks.
struct RowTileDraws {
  int64_t rows_total = 0;
  int64_t row0 = 0;
  int64_t rows = 0;
};
// The innermost RowTileDrawsScope of this thread, or nullptr.
const RowTileDraws* current_row_tile_draws();
class RowTileDrawsScope : ScopeGuard {
 public:
  explicit RowTileDrawsScope(const RowTileDraws& d);
  ~RowTileDrawsScope();

 private:
  RowTileDraws d_;
  const RowTileDraws* prev_;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0, RngPurpose purpose = RngPurpose::kTest, uint32_t rank = 0)
      : seed_(seed), purpose_(static_cast<uint32_t>(purpose)), rank_(rank) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t off) { offset_ = off; }
  uint32_t purpose() const { return purpose_; }
  uint32_t rank() const { return rank_; }
  // Parameters for a draw of n values; advances the offset (inside a RowTileDrawsScope: those
  // rows' part of the untiled draw).
  PhiloxParams take(int64_t n) {
    if (const RowTileDraws* tile = current_row_tile_draws()) return take_rows(n, *tile);
    PhiloxParams p{seed_, offset_, purpose_, rank_};
    offset_ += static_cast<uint64_t>((n + 3) / 4);
    return p;
  }
  PhiloxBlock next_block() { return philox_block(take(4), 0); }
  // A uniform integer in [0, n) from one 128-bit block (64 bits, negligible modulo bias for the
  // sizes we shuffle).
  uint64_t next_below(uint64_t n);

 private:
  PhiloxParams take_rows(int64_t n, const RowTileDraws& tile);
  uint64_t seed_;
  uint64_t offset_ = 0;
  uint32_t purpose_;
  uint32_t rank_;
};

// Fills a float tensor (any device, contiguous) from the generator.
void uniform_(const Tensor& t, Generator& gen, double lo = 0.0, double hi = 1.0);
void normal_(const Tensor& t, Generator& gen, double mean = 0.0, double std = 1.0);
// 1 with probability p, else 0, in t's dtype.
void bernoulli_(const Tensor& t, Generator& gen, double p);

// Offsets of registered generators are captured and replayed by checkpoint().
class GeneratorReplay final : public ReplayableState {
 public:
  explicit GeneratorReplay(Generator* g) : g_(g) {}
  std::shared_ptr<void> capture() override { return std::make_shared<uint64_t>(g_->offset()); }
  void restore(const std::shared_ptr<void>& s) override {
    g_->set_offset(*static_cast<uint64_t*>(s.get()));
  }

 private:
  Generator* g_;
};

namespace cuda_ops {
// CUDA fills (engine/rng.cu); kind 0 uniform, 1 normal, 2 bernoulli.
void philox_fill(const Tensor& t, const PhiloxParams& p, int kind, double a, double b);
}  // namespace cuda_ops

}  // namespace leantune
