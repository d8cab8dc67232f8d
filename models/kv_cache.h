// PagedKVCache: the generation engine's KV-cache pool, in fixed-size blocks (vLLM's paged layout).
//
// One allocation (MemTag::kKVCache) holds every layer's K and V:
//   pool:[2 * L * num_blocks * block_size, Hkv * D] in the model's dtype; layer l's K rows are
//   [(2l) * S, (2l + 1) * S) and its V rows the next S, with S = num_blocks * block_size slots.
// A sequence owns a block table (block ids in position order): position p lives in slot
// table[p / block_size] * block_size + p % block_size. Blocks are reference counted so that the
// generations of one prompt share the prompt's blocks (prefix sharing); a block written while
// shared is first copied (copy on write, copy_block).
//
// Sleep (TRL's vllm_enable_sleep_mode): sleep() gives the pool's memory back to the allocator and
// empties the allocator's cache, so that the optimizer phase does not hold the KV cache; wake()
// allocates it again. The contents are not kept: nothing in the cache outlives a generate()
// call. Sleeping with blocks in use is an error.
//
// Not thread-safe; one generate() call uses a pool at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace leantune {

struct ModelConfig;

class PagedKVCache {
 public:
  PagedKVCache(const ModelConfig& cfg, int64_t num_layers, DType dtype, Device device,
               int64_t block_size, int64_t num_blocks);

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t slots() const { return num_blocks_ * block_size_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // The pool's bytes when awake (all layers, K and V).
  int64_t bytes() const { return bytes_; }
  // Blocks handed out at once, at most, since construction.
  int64_t peak_blocks_used() const { return peak_used_; }

  // A free block with reference count 1. Error when none is free (the engine reserves blocks
  // before it admits a sequence, so this never happens there).
  int32_t allocate();
  void retain(int32_t block);
  void release(int32_t block);
  int32_t refcount(int32_t block) const;
  // The first `rows` slots of block src copied into block dst, in every layer, K and V.
  void copy_block(int32_t dst, int32_t src, int64_t rows);

  // Layer l's K or V slots: [slots(), Hkv * D] views of the pool. Awake only.
  Tensor k(int64_t layer) const;
  Tensor v(int64_t layer) const;

  void sleep();
  void wake();
  bool asleep() const { return !pool_.defined(); }

 private:
  void check_block(int32_t block, const char* what) const;
  int64_t layers_, width_, block_size_, num_blocks_, bytes_ = 0;
  DType dtype_;
  Device device_;
  Tensor pool_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the lowest ids are handed out first
  int64_t peak_used_ = 0;
};

// The blocks a pool needs to admit the `n` generations of one prompt of `prompt_len` tokens with
// at most `max_new_tokens` new tokens each, as the engine reserves them: the prompt's blocks once
// (shared), and per generation the blocks from the prompt's last, partial block up to its last
// fed token (the final sampled token is never fed back, so needs no slot). OverflowError
// (engine/checked_int.h) past 2^63 blocks.
int64_t kv_blocks_for_prompt(int64_t prompt_len, int64_t n, int64_t max_new_tokens,
                             int64_t block_size);

}  // namespace leantune
