// The paged KV-cache pool: block reference counts, copy on write, sleep and wake (see
// kv_cache.h).
#include "models/kv_cache.h"

#include <algorithm>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/checked_int.h"
#include "models/decoder.h"

namespace leantune {

PagedKVCache::PagedKVCache(const ModelConfig& cfg, int64_t num_layers, DType dtype, Device device,
                           int64_t block_size, int64_t num_blocks)
    : layers_(num_layers),
      width_(cfg.num_key_value_heads * cfg.head_dim),
      block_size_(block_size),
      num_blocks_(num_blocks),
      dtype_(dtype),
      device_(device) {
  LT_CHECK_INPUT(block_size >= 1 && num_blocks >= 1, "kv cache: block size ", block_size, " and ",
                 num_blocks, " blocks (both must be at least 1)");
  LT_CHECK_INPUT(num_blocks < (int64_t{1} << 31) && slots() < (int64_t{1} << 40),
                 "kv cache: ", num_blocks, " blocks of ", block_size, " slots is too many");
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  wake();
}

void PagedKVCache::wake() {
  if (pool_.defined()) return;
  pool_ = Tensor::empty({2 * layers_ * slots(), width_}, dtype_, device_, MemTag::kKVCache);
  bytes_ = static_cast<int64_t>(pool_.nbytes());
}

void PagedKVCache::sleep() {
  if (!pool_.defined()) return;
  LT_CHECK(free_blocks() == num_blocks_, "kv cache: sleep with ", num_blocks_ - free_blocks(),
           " blocks still in use");
  pool_ = Tensor();
  allocator(device_).empty_cache();
}

void PagedKVCache::check_block(int32_t block, const char* what) const {
  LT_CHECK(block >= 0 && block < num_blocks_ && refs_[static_cast<size_t>(block)] > 0,
           "kv cache: ", what, " of block ", block, ", which is not in use (", num_blocks_,
           " blocks)");
}

int32_t PagedKVCache::allocate() {
  LT_CHECK(!free_.empty(), "kv cache: all ", num_blocks_, " blocks are in use");
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  peak_used_ = std::max(peak_used_, num_blocks_ - free_blocks());
  return b;
}

void PagedKVCache::retain(int32_t block) {
  check_block(block, "retain");
  ++refs_[static_cast<size_t>(block)];
}

void PagedKVCache::release(int32_t block) {
  check_block(block, "release");
  if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

int32_t PagedKVCache::refcount(int32_t block) const {
  LT_CHECK(block >= 0 && block < num_blocks_, "kv cache: block ", block, " of ", num_blocks_);
  return refs_[static_cast<size_t>(block)];
}

Tensor PagedKVCache::k(int64_t layer) const {
  LT_CHECK(pool_.defined() && layer >= 0 && layer < layers_, "kv cache: layer ", layer, " of ",
           layers_, pool_.defined() ? "" : " while asleep");
  return pool_.narrow(0, 2 * layer * slots(), slots());
}

Tensor PagedKVCache::v(int64_t layer) const {
  LT_CHECK(pool_.defined() && layer >= 0 && layer < layers_, "kv cache: layer ", layer, " of ",
           layers_, pool_.defined() ? "" : " while asleep");
  return pool_.narrow(0, (2 * layer + 1) * slots(), slots());
}

void PagedKVCache::copy_block(int32_t dst, int32_t src, int64_t rows) {
  check_block(dst, "copy into");
  check_block(src, "copy from");
  LT_CHECK(rows >= 0 && rows <= block_size_, "kv cache: copying ", rows, " rows of a block of ",
           block_size_);
  if (rows == 0) return;
  for (int64_t l = 0; l < layers_; ++l)
    for (const Tensor& side : {k(l), v(l)})
      side.narrow(0, dst * block_size_, rows).copy_(side.narrow(0, src * block_size_, rows));
}

int64_t kv_blocks_for_prompt(int64_t prompt_len, int64_t n, int64_t max_new_tokens,
                             int64_t block_size) {
  LT_CHECK(prompt_len >= 1 && n >= 0 && max_new_tokens >= 0 && block_size >= 1,
           "kv_blocks_for_prompt: prompt ", prompt_len, ", n ", n, ", max_new_tokens ",
           max_new_tokens, ", block size ", block_size);
  using I = CheckedInt;
  const I shared = (I(prompt_len) + block_size - 1) / block_size;
  const I fed = I(prompt_len) + max_new_tokens - 1;  // positions written, at most
  const I own =
      max_new_tokens >= 2 ? (fed + block_size - 1) / block_size - prompt_len / block_size : I(0);
  return (shared + own * n).get();
}

}  // namespace leantune
