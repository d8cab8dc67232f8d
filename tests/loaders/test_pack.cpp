// Packing: hand-computed cases for every strategy, TRL's acceptance cases 1-8, and parity with
// TRL's pack_dataset on generated cases (tests/fixtures/packing/trl_pack_cases.json, made by
// tests/fixtures/gen_pack_fixtures.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/pack.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using Seqs = std::vector<std::vector<int64_t>>;

std::vector<int64_t> lengths_of(const Seqs& seqs) {
  std::vector<int64_t> out;
  for (const auto& s : seqs) out.push_back(static_cast<int64_t>(s.size()));
  return out;
}

// The packed column: for each bin, the concatenated tokens of its segments.
Seqs materialize(const Packing& p, const Seqs& column) {
  Seqs out;
  for (int64_t b = 0; b < p.num_bins(); ++b) {
    std::vector<int64_t> row;
    for (const Segment& s : p.bin(b)) {
      const auto& src = column[static_cast<size_t>(s.item)];
      row.insert(row.end(), src.begin() + s.begin, src.begin() + s.begin + s.length);
    }
    out.push_back(row);
  }
  return out;
}

std::vector<std::vector<int32_t>> all_seq_lengths(const Packing& p) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t b = 0; b < p.num_bins(); ++b) out.push_back(p.seq_lengths(b));
  return out;
}

Packing pack(const Seqs& seqs, int64_t max_length, const char* strategy, int64_t window = 0) {
  const auto lengths = lengths_of(seqs);
  return pack_lengths(lengths, max_length, parse_packing_strategy(strategy), window);
}

// ---- TRL acceptance cases (trl_semantics.md §10)

TEST(PackAcceptance, Case1Bfd) {
  const Seqs ids = {{1, 2, 3}, {4, 5, 6, 7}, {8}};
  const Packing p = pack(ids, 4, "bfd");
  EXPECT_EQ(materialize(p, ids), (Seqs{{4, 5, 6, 7}, {1, 2, 3, 8}}));
  EXPECT_EQ(all_seq_lengths(p), (std::vector<std::vector<int32_t>>{{4}, {3, 1}}));
}

TEST(PackAcceptance, Case2BfdTruncate) {
  const Seqs ids = {{1, 2, 3, 4, 5}, {6, 7}, {8, 9, 10, 11}, {12}};
  const Packing p = pack(ids, 4, "bfd");
  EXPECT_EQ(materialize(p, ids), (Seqs{{1, 2, 3, 4}, {8, 9, 10, 11}, {6, 7, 12}}));
  EXPECT_EQ(all_seq_lengths(p), (std::vector<std::vector<int32_t>>{{4}, {4}, {2, 1}}));
  EXPECT_EQ(p.dropped_tokens, 1);
  EXPECT_EQ(p.truncated_items, 1);
  EXPECT_EQ(p.real_tokens, 11);
}

TEST(PackAcceptance, Case3BfdSplit) {
  const Seqs ids = {{1, 2, 3, 4, 5}, {6, 7}, {8, 9, 10, 11}, {12}};
  const Packing p = pack(ids, 4, "bfd_split");
  EXPECT_EQ(materialize(p, ids), (Seqs{{1, 2, 3, 4}, {8, 9, 10, 11}, {6, 7, 5, 12}}));
  EXPECT_EQ(all_seq_lengths(p), (std::vector<std::vector<int32_t>>{{4}, {4}, {2, 1, 1}}));
  EXPECT_EQ(p.dropped_tokens, 0);
  EXPECT_EQ(p.split_items, 1);
}

TEST(PackAcceptance, Case4BfdSplitL5) {
  const Seqs ids = {{1, 2, 3, 4, 5}, {6}, {7, 8, 9, 10}, {11, 12, 13}};
  const Packing p = pack(ids, 5, "bfd_split");
  EXPECT_EQ(materialize(p, ids), (Seqs{{1, 2, 3, 4, 5}, {7, 8, 9, 10, 6}, {11, 12, 13}}));
  EXPECT_EQ(all_seq_lengths(p), (std::vector<std::vector<int32_t>>{{5}, {4, 1}, {3}}));
}

TEST(PackAcceptance, Case5BfdSplitTieOrder) {
  const Seqs ids = {{1, -2, 3, -4, 5, -6}, {7, -8, 9}, {-10, 11, -12}, {13, -14, 15, -16}};
  const Packing p = pack(ids, 4, "bfd_split");
  EXPECT_EQ(materialize(p, ids),
            (Seqs{{1, -2, 3, -4}, {13, -14, 15, -16}, {7, -8, 9}, {-10, 11, -12}, {5, -6}}));
  EXPECT_EQ(all_seq_lengths(p), (std::vector<std::vector<int32_t>>{{4}, {4}, {3}, {3}, {2}}));
}

TEST(PackAcceptance, Case6EmptySequences) {
  const Seqs ids = {{1, 2}, {}, {3, 4, 5}, {}, {6}};
  const Packing p = pack(ids, 4, "bfd_split");
  EXPECT_EQ(materialize(p, ids), (Seqs{{3, 4, 5, 6}, {1, 2}}));
  EXPECT_EQ(all_seq_lengths(p), (std::vector<std::vector<int32_t>>{{3, 1}, {2}}));
  EXPECT_EQ(p.empty_items, 2);
}

TEST(PackAcceptance, Case7TwoColumns) {
  const Seqs ids = {{1, 2, 3, 4, 5}, {6, 7}, {8, 9, 10}, {11}};
  const Seqs mask = {{1, 1, 1, 0, 0}, {1, 0}, {1, 1, 0}, {1}};
  const Packing bfd = pack(ids, 4, "bfd");
  EXPECT_EQ(materialize(bfd, ids), (Seqs{{1, 2, 3, 4}, {8, 9, 10, 11}, {6, 7}}));
  EXPECT_EQ(materialize(bfd, mask), (Seqs{{1, 1, 1, 0}, {1, 1, 0, 1}, {1, 0}}));
  EXPECT_EQ(all_seq_lengths(bfd), (std::vector<std::vector<int32_t>>{{4}, {3, 1}, {2}}));
  const Packing split = pack(ids, 4, "bfd_split");
  EXPECT_EQ(materialize(split, ids), (Seqs{{1, 2, 3, 4}, {8, 9, 10, 5}, {6, 7, 11}}));
  EXPECT_EQ(materialize(split, mask), (Seqs{{1, 1, 1, 0}, {1, 1, 0, 0}, {1, 0, 1}}));
  EXPECT_EQ(all_seq_lengths(split), (std::vector<std::vector<int32_t>>{{4}, {3, 1}, {2, 1}}));
}

TEST(PackAcceptance, Case8Wrapped) {
  const Seqs ids = {{1, 2, 3}, {4, 5, 6, 7}, {8}};
  const Seqs mask = {{0, 1, 1}, {0, 0, 1, 1}, {1}};
  const Packing p = pack(ids, 3, "wrapped");
  EXPECT_EQ(materialize(p, ids), (Seqs{{1, 2, 3}, {4, 5, 6}, {7, 8}}));
  EXPECT_EQ(materialize(p, mask), (Seqs{{0, 1, 1}, {0, 0, 1}, {1, 1}}));
  // A wrapped bin is one sequence.
  EXPECT_EQ(all_seq_lengths(p), (std::vector<std::vector<int32_t>>{{3}, {3}, {2}}));
  EXPECT_TRUE(p.bin_is_one_sequence());
}

// ---- hand-computed cases

struct HandCase {
  std::string name;
  std::vector<int64_t> lengths;
  int64_t max_length;
  std::string strategy;
  std::vector<std::vector<Segment>> bins;
};

std::ostream& operator<<(std::ostream& os, const HandCase& c) { return os << c.name; }

class PackHand : public ::testing::TestWithParam<HandCase> {};

TEST_P(PackHand, Bins) {
  const HandCase& c = GetParam();
  const Packing p = pack_lengths(c.lengths, c.max_length, parse_packing_strategy(c.strategy));
  ASSERT_EQ(p.num_bins(), static_cast<int64_t>(c.bins.size()));
  int64_t total = 0;
  for (int64_t b = 0; b < p.num_bins(); ++b) {
    const auto got = p.bin(b);
    EXPECT_EQ(std::vector<Segment>(got.begin(), got.end()), c.bins[static_cast<size_t>(b)])
        << "bin " << b;
    int64_t len = 0;
    for (const Segment& s : got) len += s.length;
    EXPECT_EQ(p.bin_lengths[static_cast<size_t>(b)], len);
    EXPECT_LE(len, c.max_length);
    total += len;
  }
  EXPECT_EQ(p.real_tokens, total);
}

std::vector<Segment> segs(std::initializer_list<std::array<int64_t, 3>> l) {
  std::vector<Segment> out;
  for (const auto& a : l) out.push_back({a[0], a[1], a[2]});
  return out;
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, PackHand,
    ::testing::Values(
        // Equal lengths keep input order and fill bins pairwise.
        HandCase{"bfd_ties",
                 {2, 2, 2, 2},
                 4,
                 "bfd",
                 {segs({{0, 0, 2}, {1, 0, 2}}), segs({{2, 0, 2}, {3, 0, 2}})}},
        // Among bins with the same free space the oldest is used; a smaller fitting space wins.
        HandCase{"bfd_fifo_same_space",
                 {3, 3, 1, 1},
                 5,
                 "bfd",
                 {segs({{0, 0, 3}, {2, 0, 1}, {3, 0, 1}}), segs({{1, 0, 3}})}},
        // Best fit, not first fit: the 4 goes to the bin with 4 free, not the one with 5.
        HandCase{"bfd_best_not_first_fit",
                 {6, 5, 4, 3},
                 10,
                 "bfd",
                 {segs({{0, 0, 6}, {2, 0, 4}}), segs({{1, 0, 5}, {3, 0, 3}})}},
        HandCase{"bfd_exact_max_length",
                 {3, 3, 1},
                 3,
                 "bfd",
                 {segs({{0, 0, 3}}), segs({{1, 0, 3}}), segs({{2, 0, 1}})}},
        HandCase{"bfd_longer_than_max", {7, 2}, 3, "bfd", {segs({{0, 0, 3}}), segs({{1, 0, 2}})}},
        HandCase{"bfd_split_longer_than_max",
                 {7, 2},
                 3,
                 "bfd_split",
                 {segs({{0, 0, 3}}), segs({{0, 3, 3}}), segs({{1, 0, 2}, {0, 6, 1}})}},
        HandCase{"bfd_empty_sequences", {0, 2, 0, 1}, 3, "bfd", {segs({{1, 0, 2}, {3, 0, 1}})}},
        HandCase{"bfd_empty_input", {}, 4, "bfd", {}},
        HandCase{"bfd_only_empty", {0, 0}, 4, "bfd_split", {}},
        HandCase{"bfd_max_length_1", {2, 0, 1}, 1, "bfd", {segs({{0, 0, 1}}), segs({{2, 0, 1}})}},
        HandCase{"bfd_split_max_length_1",
                 {2, 0, 1},
                 1,
                 "bfd_split",
                 {segs({{0, 0, 1}}), segs({{0, 1, 1}}), segs({{2, 0, 1}})}},
        HandCase{"wrapped_max_length_1",
                 {2, 0, 1},
                 1,
                 "wrapped",
                 {segs({{0, 0, 1}}), segs({{0, 1, 1}}), segs({{2, 0, 1}})}},
        HandCase{
            "wrapped_exact_blocks", {2, 2}, 2, "wrapped", {segs({{0, 0, 2}}), segs({{1, 0, 2}})}},
        HandCase{"wrapped_spans_documents",
                 {3, 4, 1},
                 5,
                 "wrapped",
                 {segs({{0, 0, 3}, {1, 0, 2}}), segs({{1, 2, 2}, {2, 0, 1}})}},
        HandCase{"wrapped_empty_input", {}, 3, "wrapped", {}}),
    [](const ::testing::TestParamInfo<HandCase>& info) { return info.param.name; });

TEST(Pack, CountsAndEfficiency) {
  const std::vector<int64_t> lengths = {5, 0, 2, 4, 1};
  const Packing p = pack_lengths(lengths, 4, PackingStrategy::kBfd);
  EXPECT_EQ(p.input_items, 5);
  EXPECT_EQ(p.empty_items, 1);
  EXPECT_EQ(p.truncated_items, 1);
  EXPECT_EQ(p.dropped_tokens, 1);
  EXPECT_EQ(p.real_tokens, 11);
  EXPECT_EQ(p.num_bins(), 3);
  EXPECT_DOUBLE_EQ(p.efficiency(), 11.0 / 12.0);
  EXPECT_DOUBLE_EQ(Packing().efficiency(), 0.0);
}

TEST(Pack, WindowPacksChunksIndependently) {
  // Whole input: the two 1s join the 3s' bins. Window 2: chunk {3,3} and chunk {1,1}.
  const std::vector<int64_t> lengths = {3, 3, 1, 1};
  const Packing whole = pack_lengths(lengths, 4, PackingStrategy::kBfd, 0);
  EXPECT_EQ(whole.num_bins(), 2);
  const Packing windowed = pack_lengths(lengths, 4, PackingStrategy::kBfd, 2);
  ASSERT_EQ(windowed.num_bins(), 3);
  EXPECT_EQ(std::vector<Segment>(windowed.bin(2).begin(), windowed.bin(2).end()),
            segs({{2, 0, 1}, {3, 0, 1}}));
  // Wrapped restarts a block at every window.
  const Packing wrapped = pack_lengths(lengths, 4, PackingStrategy::kWrapped, 2);
  EXPECT_EQ(wrapped.bin_lengths, (std::vector<int64_t>{4, 2, 2}));
}

TEST(Pack, BadArguments) {
  const std::vector<int64_t> lengths = {1};
  EXPECT_THROW(pack_lengths(lengths, 0, PackingStrategy::kBfd), Error);
  EXPECT_THROW(pack_lengths(lengths, 4, PackingStrategy::kBfd, -1), Error);
  try {
    parse_packing_strategy("first_fit");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("first_fit"), std::string::npos);
  }
}

// Invariants on random inputs, with a naive O(n * bins) best-fit as the reference.
std::vector<std::vector<Segment>> naive_bfd(const std::vector<int64_t>& lengths, int64_t L,
                                            bool split) {
  std::vector<Segment> items;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t n = lengths[i];
    if (n == 0) continue;
    if (!split) {
      items.push_back({static_cast<int64_t>(i), 0, std::min(n, L)});
    } else {
      for (int64_t b = 0; b < n; b += L)
        items.push_back({static_cast<int64_t>(i), b, std::min(L, n - b)});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Segment& a, const Segment& b) { return a.length > b.length; });
  std::vector<std::vector<Segment>> bins;
  std::vector<int64_t> space;
  std::vector<int64_t> stamp;  // when the bin reached its current space (FIFO per space)
  int64_t clock = 0;
  for (const Segment& s : items) {
    int64_t best = -1;
    for (size_t b = 0; b < bins.size(); ++b) {
      if (space[b] < s.length || space[b] == 0) continue;
      if (best < 0 || space[b] < space[static_cast<size_t>(best)] ||
          (space[b] == space[static_cast<size_t>(best)] &&
           stamp[b] < stamp[static_cast<size_t>(best)])) {
        best = static_cast<int64_t>(b);
      }
    }
    if (best < 0) {
      bins.emplace_back();
      space.push_back(L);
      stamp.push_back(0);
      best = static_cast<int64_t>(bins.size()) - 1;
    }
    bins[static_cast<size_t>(best)].push_back(s);
    space[static_cast<size_t>(best)] -= s.length;
    stamp[static_cast<size_t>(best)] = ++clock;
  }
  return bins;
}

TEST(Pack, MatchesNaiveBestFitOnRandomInputs) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t L = 1 + static_cast<int64_t>(rng() % 40);
    const size_t n = rng() % 120;
    std::vector<int64_t> lengths(n);
    for (auto& x : lengths) x = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * L + 1));
    for (bool split : {false, true}) {
      const Packing p =
          pack_lengths(lengths, L, split ? PackingStrategy::kBfdSplit : PackingStrategy::kBfd);
      const auto ref = naive_bfd(lengths, L, split);
      ASSERT_EQ(p.num_bins(), static_cast<int64_t>(ref.size())) << "trial " << trial;
      for (int64_t b = 0; b < p.num_bins(); ++b) {
        ASSERT_EQ(std::vector<Segment>(p.bin(b).begin(), p.bin(b).end()),
                  ref[static_cast<size_t>(b)])
            << "trial " << trial << " bin " << b;
      }
    }
  }
}

TEST(Pack, LargeMaxLengthUsesSortFallback) {
  // n * 16 < L takes the comparison sort path; the result must not depend on the path.
  const std::vector<int64_t> lengths = {100000, 5, 70000, 5, 30000};
  const Packing p = pack_lengths(lengths, 100000, PackingStrategy::kBfd);
  ASSERT_EQ(p.num_bins(), 3);
  EXPECT_EQ(std::vector<Segment>(p.bin(0).begin(), p.bin(0).end()), segs({{0, 0, 100000}}));
  EXPECT_EQ(std::vector<Segment>(p.bin(1).begin(), p.bin(1).end()),
            segs({{2, 0, 70000}, {4, 0, 30000}}));
  // Both full bins leave no room: the two 5s open a third bin.
  EXPECT_EQ(std::vector<Segment>(p.bin(2).begin(), p.bin(2).end()), segs({{1, 0, 5}, {3, 0, 5}}));
  EXPECT_EQ(p.real_tokens, 200010);
}

// ---- parity with TRL's pack_dataset

struct TrlCase {
  std::string name;
  std::string strategy;
  int64_t max_length = 0;
  std::vector<int64_t> lengths;
  std::vector<std::vector<int64_t>> bins;  // flat [item, begin, length, ...] per bin
  std::vector<std::vector<int32_t>> seq_lengths;
  bool has_seq_lengths = false;
};

std::ostream& operator<<(std::ostream& os, const TrlCase& c) { return os << c.name; }

std::vector<TrlCase> load_trl_cases() {
  const nlohmann::json j = read_json_file(testing::fixture_path("packing/trl_pack_cases.json"));
  std::vector<TrlCase> out;
  for (const auto& c : j.at("cases")) {
    TrlCase t;
    t.name = c.at("name").get<std::string>();
    t.strategy = c.at("strategy").get<std::string>();
    t.max_length = c.at("max_length").get<int64_t>();
    t.lengths = c.at("lengths").get<std::vector<int64_t>>();
    t.bins = c.at("bins").get<std::vector<std::vector<int64_t>>>();
    if (c.contains("seq_lengths")) {
      t.has_seq_lengths = true;
      t.seq_lengths = c.at("seq_lengths").get<std::vector<std::vector<int32_t>>>();
    }
    out.push_back(std::move(t));
  }
  return out;
}

class PackTrlParity : public ::testing::TestWithParam<TrlCase> {};

TEST_P(PackTrlParity, SameBinsAsTrl) {
  const TrlCase& c = GetParam();
  const int64_t n = static_cast<int64_t>(c.lengths.size());
  // TRL packs each 1000-row map batch on its own; up to 1000 rows the whole input is one.
  std::vector<int64_t> windows = {1000};
  if (n <= 1000) windows.push_back(0);
  for (int64_t window : windows) {
    const Packing p =
        pack_lengths(c.lengths, c.max_length, parse_packing_strategy(c.strategy), window);
    ASSERT_EQ(p.num_bins(), static_cast<int64_t>(c.bins.size())) << "window " << window;
    for (int64_t b = 0; b < p.num_bins(); ++b) {
      std::vector<int64_t> flat;
      for (const Segment& s : p.bin(b)) {
        flat.insert(flat.end(), {s.item, s.begin, s.length});
      }
      // Wrapped bins list maximal runs; ours are the same runs (one per item touched).
      ASSERT_EQ(flat, c.bins[static_cast<size_t>(b)]) << "window " << window << " bin " << b;
      if (c.has_seq_lengths) {
        ASSERT_EQ(p.seq_lengths(b), c.seq_lengths[static_cast<size_t>(b)]) << "bin " << b;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Trl, PackTrlParity, ::testing::ValuesIn(load_trl_cases()),
                         [](const ::testing::TestParamInfo<TrlCase>& info) {
                           return info.param.name;
                         });

TEST(PackTrlParity, FixtureIsPresent) {
  const auto cases = load_trl_cases();
  EXPECT_GE(cases.size(), 30u) << "tests/fixtures/packing/trl_pack_cases.json missing or short";
}

}  // namespace
}  // namespace leantune
