// Empty rows: a pre-tokenized row with empty input_ids is valid, dropped and counted
// (DataStats::empty_examples), not an error. Packed, it keeps its place in the packing windows
// and the loader's bins equal TRL's pack_dataset on the same rows, empty ones included
// (tests/fixtures/packing/trl_pack_cases.json, made by tests/fixtures/gen_pack_fixtures.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "loaders/examples.h"
#include "loaders/pack.h"
#include "testing/testing.h"

namespace leantune {
namespace {

struct EmptyRowsCase {
  std::string name, strategy;
  int64_t max_length = 0;
  std::vector<int64_t> lengths;
  std::vector<std::vector<int64_t>> bins;  // flat [item, begin, length, ...] per bin
};

std::ostream& operator<<(std::ostream& os, const EmptyRowsCase& c) { return os << c.name; }

// The TRL cases whose input holds empty sequences.
std::vector<EmptyRowsCase> cases_with_empty_rows() {
  std::ifstream f(testing::fixture_path("packing/trl_pack_cases.json"));
  if (!f) return {};
  const nlohmann::json j = nlohmann::json::parse(f);
  std::vector<EmptyRowsCase> out;
  for (const auto& c : j.at("cases")) {
    EmptyRowsCase t;
    t.name = c.at("name").get<std::string>();
    t.strategy = c.at("strategy").get<std::string>();
    t.max_length = c.at("max_length").get<int64_t>();
    t.lengths = c.at("lengths").get<std::vector<int64_t>>();
    t.bins = c.at("bins").get<std::vector<std::vector<int64_t>>>();
    if (std::count(t.lengths.begin(), t.lengths.end(), 0) > 0) out.push_back(std::move(t));
  }
  return out;
}

// One pre-tokenized row per length; token k of row i is (i * 7 + k) % 1000.
std::string write_rows(const std::vector<int64_t>& lengths) {
  const std::string path = testing::temp_dir("empty_rows") + "/rows.jsonl";
  std::ofstream f(path);
  for (size_t i = 0; i < lengths.size(); ++i) {
    f << "{\"input_ids\": [";
    for (int64_t k = 0; k < lengths[i]; ++k) f << (k ? "," : "") << (i * 7 + k) % 1000;
    f << "]}\n";
  }
  return path;
}

class EmptyRows : public ::testing::TestWithParam<EmptyRowsCase> {};

TEST_P(EmptyRows, DroppedCountedAndPackedLikeTrl) {
  const EmptyRowsCase& c = GetParam();
  const std::string path = write_rows(c.lengths);
  const int64_t empty = std::count(c.lengths.begin(), c.lengths.end(), 0);
  DataConfig cfg;
  cfg.max_length = c.max_length;
  cfg.packing = true;
  cfg.packing_strategy = c.strategy;
  cfg.packing_window = 1000;  // TRL packs each 1000-row map batch on its own
  const SftData data = load_sft_data(path, nullptr, cfg);
  EXPECT_EQ(data.stats.empty_examples, empty);
  EXPECT_EQ(data.stats.examples, static_cast<int64_t>(c.lengths.size()) - empty);
  EXPECT_NE(data.stats.summary().find(std::to_string(empty) + " empty dropped"), std::string::npos)
      << data.stats.summary();
  const Packing p = pack_lengths(data.examples.lengths(), cfg.max_length,
                                 parse_packing_strategy(c.strategy), cfg.packing_window);
  EXPECT_EQ(p.empty_items, empty);
  ASSERT_EQ(p.num_bins(), static_cast<int64_t>(c.bins.size()));
  for (int64_t b = 0; b < p.num_bins(); ++b) {
    std::vector<int64_t> flat;
    for (const Segment& s : p.bin(b)) flat.insert(flat.end(), {s.item, s.begin, s.length});
    ASSERT_EQ(flat, c.bins[static_cast<size_t>(b)]) << "bin " << b;
  }
  // Unpacked, the empty rows are gone from the examples and counted.
  cfg.packing = false;
  cfg.max_length = 0;
  const SftData plain = load_sft_data(path, nullptr, cfg);
  EXPECT_EQ(plain.stats.empty_examples, empty);
  // (A one-token row has no trainable position unpacked: dropped as such, counted apart.)
  EXPECT_EQ(plain.stats.examples + plain.stats.dropped_examples,
            static_cast<int64_t>(c.lengths.size()) - empty);
  EXPECT_EQ(plain.examples.size(), plain.stats.examples);
  for (int64_t i = 0; i < plain.examples.size(); ++i) EXPECT_GT(plain.examples.ids(i).size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Trl, EmptyRows, ::testing::ValuesIn(cases_with_empty_rows()),
                         [](const ::testing::TestParamInfo<EmptyRowsCase>& info) {
                           return info.param.name;
                         });

TEST(EmptyRowsFixture, HasWindowedCasesWithEmptyRows) {
  int64_t windowed = 0;
  for (const EmptyRowsCase& c : cases_with_empty_rows()) windowed += c.lengths.size() > 1000;
  EXPECT_GE(windowed, 2) << "regenerate tests/fixtures/packing/trl_pack_cases.json";
}

TEST(EmptyRowsFixture, OnlyEmptyRowsLeaveNothingToTrainOn) {
  const std::string path = write_rows({0, 0});
  DataConfig cfg;
  try {
    load_sft_data(path, nullptr, cfg);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("2 empty dropped"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace leantune
