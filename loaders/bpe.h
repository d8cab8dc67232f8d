// The byte-level BPE model of tokenizer.json ("model": {"type": "BPE", ...}).
//
// Works on raw bytes: each byte starts as the vocab id of its GPT-2 byte-level character, and
// merges are a hash map (left id, right id) -> (rank, merged id), so the merge loop never
// touches strings. The merge order is that of Hugging Face tokenizers (lowest rank first,
// leftmost first among equal ranks): a linear scan over cached pair ranks for short words, a
// binary heap over a linked list of symbols for long ones (both give the same result).
// ignore_merges: a pre-token that is itself a vocab token is emitted whole (Llama-3).
// Bytes without a vocab entry become unk_token when one is declared (fused if fuse_unk), and are
// dropped otherwise, as tokenizers does. A per-thread cache maps words to ids.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace leantune {

// Open-addressing map from a 64-bit key to a 64-bit value, built once.
class FlatU64Map {
 public:
  void reserve(size_t n);
  // Inserts or overwrites.
  void put(uint64_t key, uint64_t value);
  // Returns true and sets value if present.
  bool get(uint64_t key, uint64_t& value) const {
    if (keys_.empty()) return false;
    size_t i = slot(key);
    while (true) {
      const uint64_t k = keys_[i];
      if (k == key) {
        value = values_[i];
        return true;
      }
      if (k == kEmpty) return false;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ULL) >> shift_; }
  void grow();
  std::vector<uint64_t> keys_;
  std::vector<uint64_t> values_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// 64-bit hash of a short byte string (multiply-xorshift over 8-byte words).
inline uint64_t hash_bytes(std::string_view s) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;
  uint64_t h = kMul ^ (s.size() * 0xFF51AFD7ED558CCDULL);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
  }
  h ^= h >> 32;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 29;
  return h;
}

// Open-addressing map from byte strings to 64-bit values with the keys in one arena: one or two
// cache lines per lookup, where a node-based map chases several pointers (the vocab has ~150k
// entries and is hit once per pre-token).
class FlatStringMap {
 public:
  static constexpr uint64_t kMissing = ~0ULL;
  void reserve(size_t n);
  // Inserts key -> value; an existing key keeps its value unless overwrite is set.
  void insert(std::string_view key, uint64_t value, bool overwrite = false);
  uint64_t find(std::string_view key) const {
    if (slots_.empty()) return kMissing;
    const uint64_t h = hash_bytes(key);
    size_t i = h & mask_;
    while (true) {
      const Slot& s = slots_[i];
      if (s.len == kEmptyLen) return kMissing;
      if (s.hash == h && s.len == key.size() &&
          std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0) {
        return s.value;
      }
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }
  void clear();
  // Calls fn(key, value) for every entry, in no particular order.
  template <typename F>
  void for_each(F&& fn) const {
    for (const Slot& s : slots_) {
      if (s.len != kEmptyLen) fn(std::string_view(arena_.data() + s.off, s.len), s.value);
    }
  }

 private:
  static constexpr uint32_t kEmptyLen = ~0U;
  struct Slot {
    uint64_t hash;
    uint64_t value;
    uint32_t off;
    uint32_t len = kEmptyLen;
  };
  void rehash(size_t capacity);
  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

class BpeModel {
 public:
  struct Options {
    bool ignore_merges = false;
    std::optional<std::string> unk_token;  // byte-level token string
    bool fuse_unk = false;
  };

  // vocab: byte-level token strings -> ids. merges: (left, right) token strings by rank.
  // Errors (kInput) name `source`.
  BpeModel(FlatStringMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           Options options, const std::string& source);
  ~BpeModel();

  // Appends the ids of one pre-token given as raw bytes. If lengths is non-null, appends the
  // number of input bytes each id covers.
  void encode_word(std::string_view bytes, std::vector<int32_t>& ids,
                   std::vector<uint32_t>* lengths) const;
  // The same without the cache and ignore_merges, forcing the heap (true) or scan (false)
  // merge loop; for tests that check that both loops agree.
  std::vector<int32_t> merge_word_for_test(std::string_view bytes, bool use_heap) const;

  const FlatStringMap& vocab() const { return vocab_; }
  std::optional<int32_t> token_to_id(std::string_view token) const {
    const uint64_t v = vocab_.find(token);
    if (v == FlatStringMap::kMissing) return std::nullopt;
    return static_cast<int32_t>(v);
  }
  int32_t max_id() const { return max_id_; }
  size_t num_merges() const { return merges_.size(); }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len;
  };
  struct Scratch;
  bool pair_rank(int32_t a, int32_t b, uint32_t& rank, int32_t& merged) const {
    uint64_t v;
    if (!merges_.get(
            (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b),
            v)) {
      return false;
    }
    rank = static_cast<uint32_t>(v >> 32);
    merged = static_cast<int32_t>(static_cast<uint32_t>(v));
    return true;
  }
  // Fills syms with the initial symbols; returns false if a byte had no token (unk or drop).
  bool initial_symbols(std::string_view bytes, std::vector<Symbol>& syms) const;
  void merge_scan(std::vector<Symbol>& syms, Scratch& scratch) const;
  void merge_heap(std::vector<Symbol>& syms, Scratch& scratch) const;

  FlatStringMap vocab_;
  FlatStringMap raw_vocab_;  // raw bytes -> id, for ignore_merges
  int32_t byte_id_[256];
  FlatU64Map merges_;
  Options options_;
  int32_t unk_id_ = -1;
  int32_t max_id_ = -1;
  uint64_t instance_id_;
};

}  // namespace leantune
