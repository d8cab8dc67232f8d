// Best-fit-decreasing and wrapped packing over sequence lengths (see pack.h for the contract).
#include "loaders/pack.h"

#include <algorithm>
#include <bit>

#include "engine/check.h"
#include "engine/enum_names.h"

namespace leantune {

namespace {
constexpr const char* kStrategyNames[] = {"bfd", "bfd_split", "wrapped"};
static_assert(std::size(kStrategyNames) == static_cast<size_t>(PackingStrategy::kWrapped) + 1);
}  // namespace

PackingStrategy parse_packing_strategy(std::string_view name) {
  PackingStrategy s;
  if (enum_from_name(name, kStrategyNames, &s)) return s;
  LT_THROW(ErrorKind::kInput, "packing_strategy: unknown value '", name,
           "' (expected bfd, bfd_split or wrapped)");
}

const char* packing_strategy_name(PackingStrategy s) {
  return enum_name(s, kStrategyNames, "unknown");
}

std::vector<int32_t> Packing::seq_lengths(int64_t b) const {
  if (bin_is_one_sequence()) return {static_cast<int32_t>(bin_lengths[b])};
  std::vector<int32_t> out;
  for (const Segment& s : bin(b)) out.push_back(static_cast<int32_t>(s.length));
  return out;
}

double Packing::efficiency() const {
  if (bin_lengths.empty()) return 0.0;
  return static_cast<double>(real_tokens) /
         (static_cast<double>(num_bins()) * static_cast<double>(max_length));
}

namespace {

// The smallest set value >= i among 0..n-1, in O(log_64 n) word operations.
class NextSetBit {
 public:
  explicit NextSetBit(int64_t n) {
    int64_t bits = std::max<int64_t>(n, 1);
    do {
      const int64_t words = (bits + 63) / 64;
      levels_.emplace_back(static_cast<size_t>(words), 0);
      bits = words;
    } while (bits > 1);
  }
  void set(int64_t i) {
    for (auto& level : levels_) {
      uint64_t& w = level[static_cast<size_t>(i >> 6)];
      const bool was_empty = w == 0;
      w |= uint64_t{1} << (i & 63);
      if (!was_empty) return;
      i >>= 6;
    }
  }
  void reset(int64_t i) {
    for (auto& level : levels_) {
      uint64_t& w = level[static_cast<size_t>(i >> 6)];
      w &= ~(uint64_t{1} << (i & 63));
      if (w != 0) return;
      i >>= 6;
    }
  }
  int64_t next(int64_t i) const {
    size_t l = 0;
    while (true) {
      if (l == levels_.size()) return -1;
      const size_t word = static_cast<size_t>(i >> 6);
      if (word >= levels_[l].size()) return -1;
      const uint64_t m = levels_[l][word] & (~uint64_t{0} << (i & 63));
      if (m != 0) {
        i = static_cast<int64_t>((word << 6) | static_cast<size_t>(std::countr_zero(m)));
        break;
      }
      i = static_cast<int64_t>(word) + 1;
      ++l;
    }
    while (l > 0) {
      --l;
      i = (i << 6) | std::countr_zero(levels_[l][static_cast<size_t>(i)]);
    }
    return i;
  }

 private:
  std::vector<std::vector<uint64_t>> levels_;
};

// Scratch state reused across windows: best-fit lists indexed by free space.
class BestFit {
 public:
  explicit BestFit(int64_t max_length)
      : max_length_(max_length),
        free_spaces_(max_length),
        list_head_(static_cast<size_t>(max_length), -1),
        list_tail_(static_cast<size_t>(max_length), -1) {}

  // Packs items (already cut to <= max_length, in input order) and appends the bins to out.
  void pack(const std::vector<Segment>& items, Packing* out) {
    const int64_t n = static_cast<int64_t>(items.size());
    if (n == 0) return;
    sort_decreasing(items);

    bins_.clear();
    item_next_.assign(static_cast<size_t>(n), -1);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t k = order_[static_cast<size_t>(r)];
      const int64_t len = sorted_length_[static_cast<size_t>(r)];
      const int64_t space = len < max_length_ ? free_spaces_.next(len) : -1;
      int64_t b;
      if (space >= 0) {
        b = list_head_[static_cast<size_t>(space)];
        Bin& bin = bins_[static_cast<size_t>(b)];
        list_head_[static_cast<size_t>(space)] = bin.next;
        if (bin.next < 0) {
          list_tail_[static_cast<size_t>(space)] = -1;
          free_spaces_.reset(space);
        }
        item_next_[static_cast<size_t>(bin.last)] = k;
        bin.last = k;
      } else {
        b = static_cast<int64_t>(bins_.size());
        bins_.push_back({max_length_, k, k, -1});
      }
      Bin& bin = bins_[static_cast<size_t>(b)];
      bin.space -= len;
      if (bin.space > 0) {
        bin.next = -1;
        int64_t& tail = list_tail_[static_cast<size_t>(bin.space)];
        if (tail < 0) {
          list_head_[static_cast<size_t>(bin.space)] = b;
          free_spaces_.set(bin.space);
        } else {
          bins_[static_cast<size_t>(tail)].next = b;
        }
        tail = b;
      }
    }

    out->segments.reserve(out->segments.size() + items.size());
    out->bin_offsets.reserve(out->bin_offsets.size() + bins_.size());
    out->bin_lengths.reserve(out->bin_lengths.size() + bins_.size());
    for (const Bin& bin : bins_) {
      for (int64_t k = bin.first; k >= 0; k = item_next_[static_cast<size_t>(k)]) {
        out->segments.push_back(items[static_cast<size_t>(k)]);
      }
      out->bin_offsets.push_back(static_cast<int64_t>(out->segments.size()));
      out->bin_lengths.push_back(max_length_ - bin.space);
    }
    // Leave the lists empty for the next window (only the non-empty ones are touched).
    for (int64_t s = free_spaces_.next(1); s >= 0; s = free_spaces_.next(1)) {
      list_head_[static_cast<size_t>(s)] = -1;
      list_tail_[static_cast<size_t>(s)] = -1;
      free_spaces_.reset(s);
    }
  }

 private:
  // order_ = item indices by decreasing length, ties in input order (stable).
  void sort_decreasing(const std::vector<Segment>& items) {
    const int64_t n = static_cast<int64_t>(items.size());
    order_.resize(static_cast<size_t>(n));
    if (n * 16 < max_length_) {
      for (int64_t i = 0; i < n; ++i) order_[static_cast<size_t>(i)] = i;
      std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
        return items[static_cast<size_t>(a)].length > items[static_cast<size_t>(b)].length;
      });
      fill_sorted_lengths(items);
      return;
    }
    // Counting sort: start_[len] = number of items strictly longer than len.
    start_.assign(static_cast<size_t>(max_length_ + 2), 0);
    for (const Segment& s : items) ++start_[static_cast<size_t>(s.length)];
    int64_t acc = 0;
    for (int64_t len = max_length_; len >= 0; --len) {
      const int64_t c = start_[static_cast<size_t>(len)];
      start_[static_cast<size_t>(len)] = acc;
      acc += c;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t len = items[static_cast<size_t>(i)].length;
      order_[static_cast<size_t>(start_[static_cast<size_t>(len)]++)] = i;
    }
    fill_sorted_lengths(items);
  }

  void fill_sorted_lengths(const std::vector<Segment>& items) {
    sorted_length_.resize(order_.size());
    for (size_t r = 0; r < order_.size(); ++r) {
      sorted_length_[r] = items[static_cast<size_t>(order_[r])].length;
    }
  }

  int64_t max_length_;
  NextSetBit free_spaces_;
  std::vector<int64_t> list_head_, list_tail_;
  // A bin's free space, its first and last item (items chain through item_next_), and the next
  // bin in the FIFO list of its free space.
  struct Bin {
    int64_t space, first, last, next;
  };
  std::vector<Bin> bins_;
  std::vector<int64_t> order_, sorted_length_, start_;
  std::vector<int64_t> item_next_;
};

void pack_wrapped(std::span<const int64_t> lengths, int64_t first_item, int64_t max_length,
                  Packing* out) {
  int64_t in_bin = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t item = first_item + static_cast<int64_t>(i);
    int64_t begin = 0;
    while (begin < lengths[i]) {
      const int64_t take = std::min(lengths[i] - begin, max_length - in_bin);
      out->segments.push_back({item, begin, take});
      begin += take;
      in_bin += take;
      if (in_bin == max_length) {
        out->bin_offsets.push_back(static_cast<int64_t>(out->segments.size()));
        out->bin_lengths.push_back(in_bin);
        in_bin = 0;
      }
    }
  }
  if (in_bin > 0) {
    out->bin_offsets.push_back(static_cast<int64_t>(out->segments.size()));
    out->bin_lengths.push_back(in_bin);
  }
}

}  // namespace

Packing pack_lengths(std::span<const int64_t> lengths, int64_t max_length, PackingStrategy strategy,
                     int64_t window) {
  LT_CHECK_INPUT(max_length >= 1, "packing needs max_length >= 1, got ", max_length);
  LT_CHECK_INPUT(window >= 0, "packing_window must be >= 0, got ", window);
  Packing out;
  out.strategy = strategy;
  out.max_length = max_length;
  out.input_items = static_cast<int64_t>(lengths.size());
  for (int64_t len : lengths) {
    LT_CHECK(len >= 0, "negative sequence length ", len);
    if (len == 0) ++out.empty_items;
  }
  const int64_t n = static_cast<int64_t>(lengths.size());
  const int64_t chunk = window > 0 ? window : std::max<int64_t>(n, 1);

  if (strategy == PackingStrategy::kWrapped) {
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t end = std::min(n, start + chunk);
      pack_wrapped(lengths.subspan(static_cast<size_t>(start), static_cast<size_t>(end - start)),
                   start, max_length, &out);
    }
    for (int64_t len : lengths) out.real_tokens += len;
    return out;
  }

  BestFit best_fit(max_length);
  std::vector<Segment> items;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t end = std::min(n, start + chunk);
    items.clear();
    for (int64_t i = start; i < end; ++i) {
      const int64_t len = lengths[static_cast<size_t>(i)];
      if (len == 0) continue;
      if (len <= max_length) {
        items.push_back({i, 0, len});
      } else if (strategy == PackingStrategy::kBfd) {
        items.push_back({i, 0, max_length});
        ++out.truncated_items;
        out.dropped_tokens += len - max_length;
      } else {
        ++out.split_items;
        for (int64_t b = 0; b < len; b += max_length) {
          items.push_back({i, b, std::min(max_length, len - b)});
        }
      }
    }
    for (const Segment& s : items) out.real_tokens += s.length;
    best_fit.pack(items, &out);
  }
  return out;
}

}  // namespace leantune
