// Packing of sequences into bins of at most max_length tokens: exactly TRL's pack_dataset.
//
// Contract (pure functions over sequence lengths; no tokens are touched):
//   bfd        Sequences longer than max_length keep their first max_length tokens (the rest
//              is counted in dropped_tokens). Stable sort by decreasing length (ties keep input
//              order); each item goes to the bin with the smallest remaining space that fits,
//              and among bins with equal space to the oldest one (FIFO per space value); a new
//              bin when none fits. Bins come out in creation order, items inside a bin in
//              insertion order. Every item is its own sequence (seq_lengths).
//   bfd_split  As bfd, but a sequence longer than max_length is first cut into fragments
//              [0:L), [L:2L), ... (the last one shorter), each an independent item in
//              original order; nothing is discarded.
//   wrapped    All tokens concatenated in input order and cut into blocks of max_length (the
//              last block shorter). A bin is ONE sequence: documents mix, as in TRL.
// Empty sequences are dropped (counted in empty_items) by every strategy.
//
// window: TRL packs each datasets.map batch (1000 examples) independently. window = 0 packs the
// whole input at once; window = W packs the input in consecutive chunks of W items (empty ones
// included, as datasets counts rows) and concatenates the bins, which reproduces TRL exactly
// with W = 1000.
//
// Complexity: O(n + L) for the stable counting sort plus O(n log_64 L) for best fit (a 64-ary
// bit tree answers "smallest free space >= len" in a few word operations).
//
// API
//   PackingStrategy parse_packing_strategy("bfd")       // throws Error(kInput) on others
//   Packing pack_lengths(lengths, max_length, strategy, window = 0)
//   packing.num_bins(), packing.bin(b) -> span<const Segment>, packing.seq_lengths(b)
//   packing.efficiency() = real_tokens / (num_bins * max_length)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace leantune {

enum class PackingStrategy { kBfd, kBfdSplit, kWrapped };

PackingStrategy parse_packing_strategy(std::string_view name);
const char* packing_strategy_name(PackingStrategy s);

// Tokens [begin, begin + length) of input item `item`.
struct Segment {
  int64_t item = 0;
  int64_t begin = 0;
  int64_t length = 0;
  bool operator==(const Segment& o) const {
    return item == o.item && begin == o.begin && length == o.length;
  }
};

struct Packing {
  PackingStrategy strategy = PackingStrategy::kBfd;
  int64_t max_length = 0;
  std::vector<Segment> segments;        // bin after bin
  std::vector<int64_t> bin_offsets{0};  // num_bins + 1 offsets into segments
  std::vector<int64_t> bin_lengths;     // tokens per bin

  int64_t input_items = 0;
  int64_t empty_items = 0;      // dropped: no tokens
  int64_t truncated_items = 0;  // bfd: items longer than max_length
  int64_t split_items = 0;      // bfd_split: items cut into fragments
  int64_t real_tokens = 0;      // tokens placed in bins
  int64_t dropped_tokens = 0;   // bfd: overflow beyond max_length

  int64_t num_bins() const { return static_cast<int64_t>(bin_lengths.size()); }
  std::span<const Segment> bin(int64_t b) const {
    return {segments.data() + bin_offsets[b],
            static_cast<size_t>(bin_offsets[b + 1] - bin_offsets[b])};
  }
  // Sequences of bin b: each segment's length (bfd, bfd_split); the whole bin (wrapped).
  std::vector<int32_t> seq_lengths(int64_t b) const;
  bool bin_is_one_sequence() const { return strategy == PackingStrategy::kWrapped; }
  // real tokens / (bins * max_length); 0 without bins.
  double efficiency() const;
};

// lengths[i] >= 0; max_length >= 1; window >= 0.
Packing pack_lengths(std::span<const int64_t> lengths, int64_t max_length, PackingStrategy strategy,
                     int64_t window = 0);

}  // namespace leantune
