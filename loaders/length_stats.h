// Sequence-length statistics behind `trainer_bin lengths`: percentiles, kept fractions per
// candidate max_length, a recommended max_length, the efficiency each batching strategy would
// reach, and text / SVG histograms. Pure functions over a list of lengths.
//
// Definitions
//   percentile q       nearest rank: the smallest length L with at least q% of examples <= L.
//   candidates         powers of two from 128 up to the first one >= the longest example, plus
//                      the p50/p90/p95/p99/max values; sorted, duplicates removed.
//   examples_kept(L)   fraction of examples with length <= L (kept whole, not truncated).
//   tokens_kept(L)     sum(min(len, L)) / sum(len).
//   recommendation     the smallest candidate keeping >= 99% of the examples whole, rounded up
//                      to a multiple of 64 (tensor-core and pad_to_multiple_of friendly).
//   efficiency(L)      real tokens / tokens processed, at max_length L and batch size B:
//     padded           examples truncated to L, micro-batches of B in a shuffled order (the
//                      trainer's order for the given seed), each padded to its longest row.
//     padding_free     1 (no pad tokens; truncated examples still lose tokens, see tokens_kept).
//     bfd, bfd_split   real tokens / (bins * L) from the packer; bfd also drops overflow.
//     wrapped          real tokens / (bins * L).
//
// API
//   LengthSummary summarize_lengths(lengths)
//   std::vector<CandidateRow> candidate_table(lengths)
//   int64_t recommend_max_length(lengths)
//   std::vector<StrategyEfficiency> strategy_efficiencies(lengths, L, batch_size, seed)
//   std::string text_histogram(lengths, bar_width); std::string svg_histogram(...)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace leantune {

struct LengthSummary {
  int64_t count = 0;
  int64_t total = 0;
  int64_t min = 0;
  int64_t max = 0;
  double mean = 0;
  int64_t p50 = 0, p90 = 0, p95 = 0, p99 = 0;
};

LengthSummary summarize_lengths(std::span<const int64_t> lengths);
// Nearest-rank percentile of sorted lengths (q in (0, 100]).
int64_t percentile_of_sorted(std::span<const int64_t> sorted, double q);

struct CandidateRow {
  int64_t max_length = 0;
  std::string label;  // "p99", "max", or "" for a power of two
  double examples_kept = 0;
  double tokens_kept = 0;
};

std::vector<CandidateRow> candidate_table(std::span<const int64_t> lengths);
int64_t recommend_max_length(std::span<const int64_t> lengths);

struct StrategyEfficiency {
  std::string name;        // padded, padding_free, bfd, bfd_split, wrapped
  double efficiency = 0;   // real / processed tokens
  double tokens_kept = 0;  // fraction of the dataset's tokens that reach training
  int64_t rows = 0;        // micro-batches (padded, padding_free) or bins (packing)
};

std::vector<StrategyEfficiency> strategy_efficiencies(std::span<const int64_t> lengths,
                                                      int64_t max_length, int64_t batch_size,
                                                      uint64_t seed);

// Log2 buckets [2^k, 2^(k+1)) from the first non-empty one, '#' bars scaled to bar_width.
std::string text_histogram(std::span<const int64_t> lengths, int bar_width = 50);
// A self-contained SVG: a histogram of the lengths in up to 60 equal-width buckets, with
// vertical markers at p50/p90/p99 and at the recommended max_length.
std::string svg_histogram(std::span<const int64_t> lengths, const std::string& title,
                          int64_t recommended);

// SVG helpers of svg_histogram (also used by trainer_bin plot's charts).
// s with &, <, >, " escaped for XML text and attributes.
std::string xml_escape(const std::string& s);
// The step of round axis ticks: the smallest 1, 2 or 5 x 10^k giving at most max_ticks intervals
// over [0, span].
int64_t nice_tick_step(int64_t span, int max_ticks);
// A marker label: its line's x, its text; placement fills x0/x1 (the text's extent at
// kSvgCharWidth pixels per character), the side (left of the line when it would pass x_max) and
// the row (the first row where it overlaps no other label).
inline constexpr double kSvgCharWidth = 7.0;  // 12 px sans-serif, wide enough for digits
struct SvgLabel {
  double x = 0;
  std::string text;
  bool accent = false;
  double x0 = 0, x1 = 0;
  bool end_anchor = false;
  int row = 0;
};
std::vector<SvgLabel> place_labels(std::vector<SvgLabel> labels, double x_min, double x_max);

}  // namespace leantune
