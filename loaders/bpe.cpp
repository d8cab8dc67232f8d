// Byte-level BPE merge loop and word cache (see bpe.h).
#include "loaders/bpe.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "engine/check.h"
#include "loaders/unicode.h"

namespace leantune {

void FlatU64Map::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  std::vector<uint64_t> old_keys = std::move(keys_);
  std::vector<uint64_t> old_values = std::move(values_);
  keys_.assign(cap, kEmpty);
  values_.assign(cap, 0);
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  size_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_keys[i] != kEmpty) put(old_keys[i], old_values[i]);
  }
}

void FlatU64Map::grow() { reserve(std::max<size_t>(16, size_ * 2 + 2)); }

void FlatU64Map::put(uint64_t key, uint64_t value) {
  LT_CHECK(key != kEmpty, "reserved key");
  if ((size_ + 1) * 2 > keys_.size()) grow();
  size_t i = slot(key);
  while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
  if (keys_[i] == kEmpty) {
    keys_[i] = key;
    ++size_;
  }
  values_[i] = value;
}

void FlatStringMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap > slots_.size()) rehash(cap);
}

void FlatStringMap::rehash(size_t capacity) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (const Slot& s : old) {
    if (s.len == kEmptyLen) continue;
    size_t i = s.hash & mask_;
    while (slots_[i].len != kEmptyLen) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void FlatStringMap::insert(std::string_view key, uint64_t value, bool overwrite) {
  LT_CHECK(key.size() < kEmptyLen && arena_.size() + key.size() < (1ULL << 32),
           "string map too large");
  if ((size_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(16, slots_.size() * 2));
  const uint64_t h = hash_bytes(key);
  size_t i = h & mask_;
  while (slots_[i].len != kEmptyLen) {
    Slot& s = slots_[i];
    if (s.hash == h && s.len == key.size() &&
        std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0) {
      if (overwrite) s.value = value;
      return;
    }
    i = (i + 1) & mask_;
  }
  slots_[i] =
      Slot{h, value, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size())};
  arena_.append(key);
  ++size_;
}

void FlatStringMap::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  arena_.clear();
  size_ = 0;
}

namespace {

constexpr size_t kCacheMaxWordBytes = 256;
constexpr size_t kCacheMaxEntries = 1 << 17;
constexpr size_t kScanMaxSymbols = 48;  // above this the heap loop is faster

struct WordCache {
  FlatStringMap map;  // word -> (offset << 32 | count) into ids
  std::vector<int32_t> ids;
};

struct ThreadCaches {
  uint64_t last_id = 0;
  WordCache* last = nullptr;
  std::unordered_map<uint64_t, std::unique_ptr<WordCache>> by_model;

  WordCache& get(uint64_t id) {
    if (id == last_id && last) return *last;
    auto& slot = by_model[id];
    if (!slot) slot = std::make_unique<WordCache>();
    last_id = id;
    last = slot.get();
    return *slot;
  }
  void drop(uint64_t id) {
    if (id == last_id) {
      last_id = 0;
      last = nullptr;
    }
    by_model.erase(id);
  }
};

thread_local ThreadCaches t_caches;
std::atomic<uint64_t> g_next_instance{1};

}  // namespace

struct BpeModel::Scratch {
  std::vector<Symbol> syms;
  std::vector<uint32_t> ranks;
  std::vector<int32_t> merged;
  struct Entry {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  std::vector<Entry> heap;
};

BpeModel::BpeModel(FlatStringMap vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, Options options,
                   const std::string& source)
    : vocab_(std::move(vocab)), options_(std::move(options)), instance_id_(g_next_instance++) {
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  raw_vocab_.reserve(vocab_.size());
  std::string raw;
  vocab_.for_each([&](std::string_view token, uint64_t value) {
    const auto id = static_cast<int32_t>(value);
    max_id_ = std::max(max_id_, id);
    if (unicode::byte_level_to_bytes(token, raw)) {
      raw_vocab_.insert(raw, value);
      if (raw.size() == 1) byte_id_[static_cast<unsigned char>(raw[0])] = id;
    }
  });
  if (options_.unk_token) {
    const auto unk = token_to_id(*options_.unk_token);
    LT_CHECK_INPUT(unk.has_value(), source, ": unk_token '", *options_.unk_token,
                   "' is not in the vocab");
    unk_id_ = *unk;
  }
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = token_to_id(a);
    const auto ib = token_to_id(b);
    LT_CHECK_INPUT(ia && ib, source, ": merge ", rank, " ('", a, "' '", b,
                   "') uses a token that is not in the vocab");
    joined.assign(a).append(b);
    const auto im = token_to_id(joined);
    LT_CHECK_INPUT(im.has_value(), source, ": merge ", rank, " ('", a, "' '", b, "') makes '",
                   joined, "' which is not in the vocab");
    // Later duplicates overwrite earlier ones, as in tokenizers' HashMap collect.
    merges_.put(
        (static_cast<uint64_t>(static_cast<uint32_t>(*ia)) << 32) | static_cast<uint32_t>(*ib),
        (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(*im));
  }
}

BpeModel::~BpeModel() { t_caches.drop(instance_id_); }

bool BpeModel::initial_symbols(std::string_view bytes, std::vector<Symbol>& syms) const {
  syms.clear();
  bool clean = true;
  int32_t pending_unk_len = 0;  // a fused unk run not yet emitted
  auto push = [&](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1, len});
  };
  // One symbol per byte: tokenizers works per character of the byte-level string.
  size_t i = 0;
  while (i < bytes.size()) {
    const int32_t id = byte_id_[static_cast<unsigned char>(bytes[i])];
    if (id >= 0) {
      if (pending_unk_len > 0) {
        push(unk_id_, static_cast<uint32_t>(pending_unk_len));
        pending_unk_len = 0;
      }
      push(id, 1);
      ++i;
      continue;
    }
    clean = false;
    if (unk_id_ >= 0) {
      if (pending_unk_len > 0 && !options_.fuse_unk) {
        push(unk_id_, static_cast<uint32_t>(pending_unk_len));
        pending_unk_len = 0;
      }
      pending_unk_len += 1;
    }
    ++i;
  }
  if (pending_unk_len > 0) push(unk_id_, static_cast<uint32_t>(pending_unk_len));
  for (size_t k = 0; k + 1 < syms.size(); ++k) syms[k].next = static_cast<int32_t>(k + 1);
  return clean;
}

void BpeModel::merge_scan(std::vector<Symbol>& syms, Scratch& scratch) const {
  const auto n = static_cast<int32_t>(syms.size());
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  auto& ranks = scratch.ranks;
  auto& merged = scratch.merged;
  ranks.assign(n, kNone);
  merged.assign(n, -1);
  auto refresh = [&](int32_t i) {
    const int32_t j = syms[i].next;
    uint32_t r;
    int32_t m;
    if (j >= 0 && pair_rank(syms[i].id, syms[j].id, r, m)) {
      ranks[i] = r;
      merged[i] = m;
    } else {
      ranks[i] = kNone;
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) refresh(i);
  while (true) {
    uint32_t best = kNone;
    int32_t best_i = -1;
    for (int32_t i = 0; i >= 0; i = syms[i].next) {
      if (ranks[i] < best) {
        best = ranks[i];
        best_i = i;
      }
    }
    if (best_i < 0) break;
    const int32_t j = syms[best_i].next;
    syms[best_i].id = merged[best_i];
    syms[best_i].len += syms[j].len;
    syms[best_i].next = syms[j].next;
    if (syms[j].next >= 0) syms[syms[j].next].prev = best_i;
    syms[j].len = 0;
    refresh(best_i);
    if (syms[best_i].prev >= 0) refresh(syms[best_i].prev);
  }
}

void BpeModel::merge_heap(std::vector<Symbol>& syms, Scratch& scratch) const {
  using Entry = Scratch::Entry;
  auto& heap = scratch.heap;
  heap.clear();
  // Min-heap on (rank, pos): std heap functions build a max-heap, so invert the order.
  auto later = [](const Entry& a, const Entry& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto push_pair = [&](int32_t i) {
    const int32_t j = syms[i].next;
    uint32_t r;
    int32_t m;
    if (j >= 0 && pair_rank(syms[i].id, syms[j].id, r, m)) {
      heap.push_back({r, i, m});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) {
    uint32_t r;
    int32_t m;
    if (pair_rank(syms[i].id, syms[i + 1].id, r, m)) heap.push_back({r, i, m});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Entry top = heap.back();
    heap.pop_back();
    Symbol& left = syms[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const int32_t j = left.next;
    uint32_t r;
    int32_t m;
    // Stale entry: the pair at this position changed since it was pushed.
    if (!pair_rank(left.id, syms[j].id, r, m) || m != top.new_id) continue;
    left.id = m;
    left.len += syms[j].len;
    left.next = syms[j].next;
    if (syms[j].next >= 0) syms[syms[j].next].prev = top.pos;
    syms[j].len = 0;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
}

std::vector<int32_t> BpeModel::merge_word_for_test(std::string_view bytes, bool use_heap) const {
  Scratch scratch;
  initial_symbols(bytes, scratch.syms);
  if (!scratch.syms.empty()) {
    if (use_heap) {
      merge_heap(scratch.syms, scratch);
    } else {
      merge_scan(scratch.syms, scratch);
    }
  }
  std::vector<int32_t> ids;
  for (int32_t i = scratch.syms.empty() ? -1 : 0; i >= 0; i = scratch.syms[i].next) {
    ids.push_back(scratch.syms[i].id);
  }
  return ids;
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& ids,
                           std::vector<uint32_t>* lengths) const {
  if (bytes.empty()) return;
  if (options_.ignore_merges) {
    const uint64_t id = raw_vocab_.find(bytes);
    if (id != FlatStringMap::kMissing) {
      ids.push_back(static_cast<int32_t>(id));
      if (lengths) lengths->push_back(static_cast<uint32_t>(bytes.size()));
      return;
    }
  }
  if (bytes.size() == 1 && byte_id_[static_cast<unsigned char>(bytes[0])] >= 0) {
    ids.push_back(byte_id_[static_cast<unsigned char>(bytes[0])]);
    if (lengths) lengths->push_back(1);
    return;
  }
  WordCache& cache = t_caches.get(instance_id_);
  const bool cacheable = bytes.size() < kCacheMaxWordBytes;
  if (cacheable && !lengths) {
    const uint64_t hit = cache.map.find(bytes);
    if (hit != FlatStringMap::kMissing) {
      const auto off = static_cast<uint32_t>(hit >> 32);
      const auto count = static_cast<uint32_t>(hit);
      ids.insert(ids.end(), cache.ids.begin() + off, cache.ids.begin() + off + count);
      return;
    }
  }
  thread_local Scratch scratch;
  auto& syms = scratch.syms;
  const bool clean = initial_symbols(bytes, syms);
  if (syms.empty()) return;
  if (syms.size() <= kScanMaxSymbols) {
    merge_scan(syms, scratch);
  } else {
    merge_heap(syms, scratch);
  }
  const size_t first = ids.size();
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    ids.push_back(syms[i].id);
    if (lengths) lengths->push_back(syms[i].len);
  }
  if (cacheable && clean && !lengths) {
    if (cache.map.size() >= kCacheMaxEntries) {
      cache.map.clear();
      cache.ids.clear();
    }
    const auto off = static_cast<uint64_t>(cache.ids.size());
    cache.ids.insert(cache.ids.end(), ids.begin() + first, ids.end());
    cache.map.insert(bytes, (off << 32) | static_cast<uint64_t>(ids.size() - first));
  }
}

}  // namespace leantune
