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

TEST(LengthStats, SvgTicksAreRound) {
  EXPECT_EQ(nice_tick_step(990, 8), 200);  // 0, 200, ..., 1000 (not 198, 396, ...)
  EXPECT_EQ(nice_tick_step(800, 8), 100);
  EXPECT_EQ(nice_tick_step(7, 8), 1);
  EXPECT_EQ(nice_tick_step(1, 5), 1);
  EXPECT_EQ(nice_tick_step(0, 5), 1);
  EXPECT_EQ(nice_tick_step(23, 5), 5);
  EXPECT_EQ(nice_tick_step(123456, 8), 20000);
  const std::string svg = svg_histogram(std::vector<int64_t>{10, 500, 990}, "t", 1024);
  for (const char* tick : {">0</text>", ">200</text>", ">400</text>", ">1000</text>"})
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  EXPECT_NE(svg.find(">1200</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find(">198</text>"), std::string::npos) << svg;
}

TEST(LengthStats, SvgLabelsStayInsideAndApart) {
  // Two close markers and one at the right edge: the close ones take two rows, the last one
  // turns left of its line.
  std::vector<SvgLabel> in = {{100, "p90 300"}, {104, "p99 312"}, {890, "max_length 1024", true}};
  const std::vector<SvgLabel> out = place_labels(in, 0, 896);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].row, 0);
  EXPECT_EQ(out[1].row, 1);
  EXPECT_FALSE(out[0].end_anchor);
  EXPECT_TRUE(out[2].end_anchor);
  EXPECT_LE(out[2].x1, 896);
  EXPECT_EQ(out[2].row, 0);
  for (const SvgLabel& l : out) {
    EXPECT_GE(l.x0, 0);
    EXPECT_LE(l.x1, 896);
    EXPECT_DOUBLE_EQ(l.x1 - l.x0, kSvgCharWidth * static_cast<double>(l.text.size()));
  }
  for (size_t a = 0; a < out.size(); ++a)
    for (size_t b = a + 1; b < out.size(); ++b)
      if (out[a].row == out[b].row) {
        EXPECT_TRUE(out[a].x1 <= out[b].x0 || out[b].x1 <= out[a].x0) << a << " " << b;
      }
}

}  // namespace
}  // namespace leantune
