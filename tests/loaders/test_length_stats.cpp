// Length statistics of `trainer_bin lengths`: nearest-rank percentiles, candidate table, the
// recommendation rule, strategy efficiencies and the histograms.
#include <gtest/gtest.h>

#include "loaders/length_stats.h"
#include "testing/testing.h"

namespace leantune {
namespace {

TEST(LengthStats, NearestRankPercentiles) {
  std::vector<int64_t> lengths;
  for (int64_t i = 1; i <= 100; ++i) lengths.push_back(i);
  const LengthSummary s = summarize_lengths(lengths);
  EXPECT_EQ(s.count, 100);
  EXPECT_EQ(s.total, 5050);
  EXPECT_EQ(s.p50, 50);
  EXPECT_EQ(s.p90, 90);
  EXPECT_EQ(s.p95, 95);
  EXPECT_EQ(s.p99, 99);
  EXPECT_EQ(s.max, 100);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  const std::vector<int64_t> one = {7};
  EXPECT_EQ(summarize_lengths(one).p50, 7);
  EXPECT_EQ(summarize_lengths(std::vector<int64_t>{}).count, 0);
}

TEST(LengthStats, CandidateTableAndRecommendation) {
  std::vector<int64_t> lengths(99, 100);
  lengths.push_back(1000);
  const auto rows = candidate_table(lengths);
  // Powers of two 128..1024, plus 100 (p50..p99) and 1000 (max).
  std::vector<int64_t> points;
  for (const auto& r : rows) points.push_back(r.max_length);
  EXPECT_EQ(points, (std::vector<int64_t>{100, 128, 256, 512, 1000, 1024}));
  EXPECT_EQ(rows[0].label, "p50,p90,p95,p99");
  EXPECT_DOUBLE_EQ(rows[0].examples_kept, 0.99);
  EXPECT_DOUBLE_EQ(rows[0].tokens_kept, 10000.0 / 10900.0);
  EXPECT_EQ(rows[4].label, "max");
  EXPECT_DOUBLE_EQ(rows[4].examples_kept, 1.0);
  // 100 keeps 99% of the examples whole; rounded up to a multiple of 64.
  EXPECT_EQ(recommend_max_length(lengths), 128);
}

TEST(LengthStats, StrategyEfficiencies) {
  const std::vector<int64_t> lengths = {4, 2, 2, 4};
  const auto eff = strategy_efficiencies(lengths, 4, 2, 0);
  ASSERT_EQ(eff.size(), 5u);
  EXPECT_EQ(eff[0].name, "padded");
  EXPECT_GE(eff[0].efficiency, 0.75 - 1e-12);  // 12 real tokens over 12 or 16 processed
  EXPECT_LE(eff[0].efficiency, 1.0);
  EXPECT_EQ(eff[1].name, "padding_free");
  EXPECT_DOUBLE_EQ(eff[1].efficiency, 1.0);
  EXPECT_EQ(eff[2].name, "bfd");
  EXPECT_DOUBLE_EQ(eff[2].efficiency, 1.0);  // [4] [4] [2,2]
  EXPECT_EQ(eff[2].rows, 3);
  EXPECT_EQ(eff[4].name, "wrapped");
  EXPECT_DOUBLE_EQ(eff[4].efficiency, 1.0);
  // Truncation shows as tokens_kept below 1.
  const auto cut = strategy_efficiencies(lengths, 3, 2, 0);
  EXPECT_DOUBLE_EQ(cut[0].tokens_kept, 10.0 / 12.0);
  EXPECT_DOUBLE_EQ(cut[3].tokens_kept, 1.0);  // bfd_split keeps everything
}

TEST(LengthStats, Histograms) {
  const std::vector<int64_t> lengths = {3, 3, 5, 100};
  const std::string text = text_histogram(lengths, 10);
  EXPECT_EQ(text.rfind("  [2, 4)", 0), 0u) << text;  // starts at the first non-empty bucket
  EXPECT_NE(text.find("2 |##########\n"), std::string::npos) << text;
  EXPECT_NE(text.find("[64, 128)"), std::string::npos);
  const std::string svg = svg_histogram(lengths, "a<b", 128);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("a&lt;b"), std::string::npos);
  EXPECT_NE(svg.find("max_length 128"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace leantune
