// Data loader: per-epoch shuffling reproducible from the seed and different across epochs,
// sharding by rank that covers every batch, byte-equal continuation after a state round trip,
// packed micro-batches with their reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "engine/check.h"
#include "loaders/data_loader.h"
#include "testing/testing.h"

namespace leantune {
namespace {

std::shared_ptr<TokenizedDataset> make_data(int64_t n, uint64_t seed = 3) {
  auto d = std::make_shared<TokenizedDataset>();
  uint64_t x = seed;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t len = 1 + static_cast<int64_t>((x >> 33) % 13);
    std::vector<int32_t> ids(static_cast<size_t>(len));
    std::vector<uint8_t> mask(static_cast<size_t>(len), 1);
    for (int64_t k = 0; k < len; ++k)
      ids[static_cast<size_t>(k)] = static_cast<int32_t>(1000 * i + k);
    if (len > 2) mask[0] = 0;
    d->add(ids, mask, i + 1);
  }
  return d;
}

DataConfig loader_config(int64_t batch_size) {
  DataConfig c;
  c.max_length = 16;
  c.per_device_train_batch_size = batch_size;
  c.seed = 1234;
  return c;
}

// All bytes of a batch, for byte-equality checks.
std::vector<int64_t> flatten(const Batch& b) {
  std::vector<int64_t> out;
  for (const Tensor* t : {&b.input_ids, &b.position_ids, &b.labels, &b.cu_seqlens}) {
    const auto v = t->to_i64();
    out.push_back(static_cast<int64_t>(v.size()));
    out.insert(out.end(), v.begin(), v.end());
  }
  out.push_back(b.max_seqlen);
  return out;
}

TEST(EpochSampler, PermutationReproducibleAndDifferentAcrossEpochs) {
  const EpochSampler a(100, 8, 42, true), b(100, 8, 42, true), c(100, 8, 43, true);
  const auto e0 = a.order(0);
  EXPECT_EQ(e0, b.order(0));
  EXPECT_NE(e0, a.order(1));
  EXPECT_NE(e0, c.order(0));
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(100);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  // Each epoch on its own: asking for epoch 5 first gives the same as after epochs 0..4.
  const EpochSampler fresh(100, 8, 42, true);
  EXPECT_EQ(fresh.order(5), a.order(5));
  // No shuffle: input order.
  EXPECT_EQ(EpochSampler(100, 8, 42, false).order(3), iota);
}

TEST(EpochSampler, BatchesCoverTheEpoch) {
  const EpochSampler s(10, 3, 1, true);
  EXPECT_EQ(s.batches_per_epoch(), 4);
  std::vector<int64_t> seen;
  for (int64_t j = 0; j < s.batches_per_epoch(); ++j) {
    const auto b = s.batch(2, j);
    EXPECT_EQ(b.size(), j < 3 ? 3u : 1u);
    seen.insert(seen.end(), b.begin(), b.end());
  }
  EXPECT_EQ(seen, s.order(2));
}

// drop_last: only whole global batches, floor(global / world) per rank, no batch on two ranks
// and none repeated; the units left over are those past the last whole round of the order.
TEST(EpochSampler, DropLastTakesWholeRoundsOnly) {
  for (int world : {1, 2, 3}) {
    std::vector<int64_t> seen;
    for (int r = 0; r < world; ++r) {
      const EpochSampler s(19, 4, 7, true, r, world, /*drop_last=*/true);
      EXPECT_EQ(s.global_batches_per_epoch(), 4);
      EXPECT_EQ(s.batches_per_epoch(), 4 / world) << "world " << world;
      EXPECT_EQ(s.repeated_batches_per_epoch(), 0);
      for (int64_t j = 0; j < s.batches_per_epoch(); ++j) {
        const auto b = s.batch(0, j);
        EXPECT_EQ(b.size(), 4u);
        seen.insert(seen.end(), b.begin(), b.end());
      }
    }
    const std::vector<int64_t> order = EpochSampler(19, 4, 7, true).order(0);
    std::vector<int64_t> expected(order.begin(), order.begin() + 4 * (4 / world) * world);
    std::sort(seen.begin(), seen.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(seen, expected) << "world " << world;
  }
  EXPECT_EQ(EpochSampler(3, 4, 7, true, 0, 1, true).batches_per_epoch(), 0);
}

struct ShardCase {
  int64_t units, batch_size;
  int world;
};

class Sharding : public ::testing::TestWithParam<ShardCase> {};

TEST_P(Sharding, EveryBatchOnceAndEqualCounts) {
  const ShardCase c = GetParam();
  const EpochSampler one(c.units, c.batch_size, 9, true);
  const int64_t global = one.batches_per_epoch();
  std::map<std::vector<int64_t>, int> count;
  int64_t per_rank = -1;
  for (int r = 0; r < c.world; ++r) {
    const EpochSampler s(c.units, c.batch_size, 9, true, r, c.world);
    if (per_rank < 0) per_rank = s.batches_per_epoch();
    EXPECT_EQ(s.batches_per_epoch(), per_rank) << "rank " << r;
    for (int64_t j = 0; j < s.batches_per_epoch(); ++j) ++count[s.batch(1, j)];
  }
  // Every global batch is seen; each exactly once unless the rounds do not divide, where the
  // wrapped-around ones are counted as repeated.
  ASSERT_EQ(static_cast<int64_t>(count.size()), global);
  int64_t extra = 0;
  for (int64_t g = 0; g < global; ++g) {
    const auto b = one.batch(1, g);
    ASSERT_TRUE(count.count(b)) << "global batch " << g << " never seen";
    extra += count[b] - 1;
  }
  const EpochSampler r0(c.units, c.batch_size, 9, true, 0, c.world);
  EXPECT_EQ(extra, r0.repeated_batches_per_epoch());
  if (global % c.world == 0) {
    EXPECT_EQ(extra, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, Sharding,
                         ::testing::Values(ShardCase{64, 4, 2}, ShardCase{64, 4, 4},
                                           ShardCase{65, 4, 2}, ShardCase{100, 3, 4},
                                           ShardCase{7, 8, 2}, ShardCase{37, 1, 3}),
                         [](const ::testing::TestParamInfo<ShardCase>& info) {
                           const ShardCase& c = info.param;
                           return "units" + std::to_string(c.units) + "_bs" +
                                  std::to_string(c.batch_size) + "_world" + std::to_string(c.world);
                         });

struct ResumeCase {
  std::string name;
  bool packing;
  std::string strategy;
  int world;
  int64_t k, m;  // batches before the save, batches compared after
};

class LoaderResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(LoaderResume, ContinuesByteEqual) {
  const ResumeCase& c = GetParam();
  const auto data = make_data(120);
  DataConfig cfg = loader_config(4);
  cfg.packing = c.packing;
  cfg.packing_strategy = c.strategy;
  for (int r = 0; r < c.world; ++r) {
    DataLoader a(data, cfg, 0, r, c.world);
    for (int64_t i = 0; i < c.k; ++i) a.next();
    const std::string saved = a.state().to_json();
    std::vector<std::vector<int64_t>> expected;
    for (int64_t i = 0; i < c.m; ++i) expected.push_back(flatten(a.next()));

    DataLoader b(data, cfg, 0, r, c.world);
    b.set_state(LoaderState::from_json(saved));
    for (int64_t i = 0; i < c.m; ++i) {
      ASSERT_EQ(flatten(b.next()), expected[static_cast<size_t>(i)])
          << "rank " << r << " batch " << c.k + i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    States, LoaderResume,
    ::testing::Values(ResumeCase{"examples_mid_epoch", false, "bfd", 1, 7, 10},
                      ResumeCase{"examples_across_epochs", false, "bfd", 1, 25, 40},
                      ResumeCase{"bfd_two_ranks", true, "bfd", 2, 3, 20},
                      ResumeCase{"bfd_split_at_epoch_end", true, "bfd_split", 1, 0, 30},
                      ResumeCase{"wrapped_three_ranks", true, "wrapped", 3, 5, 12}),
    [](const ::testing::TestParamInfo<ResumeCase>& info) { return info.param.name; });

TEST(DataLoader, EpochBoundaryAndStateAtEnd) {
  const auto data = make_data(10);
  DataLoader a(data, loader_config(4), 0);
  EXPECT_EQ(a.batches_per_epoch(), 3);
  for (int i = 0; i < 3; ++i) a.next();
  EXPECT_EQ(a.epoch(), 0);
  EXPECT_EQ(a.step_in_epoch(), 3);
  const LoaderState s = a.state();
  a.next();
  EXPECT_EQ(a.epoch(), 1);
  EXPECT_EQ(a.step_in_epoch(), 1);
  DataLoader b(data, loader_config(4), 0);
  b.set_state(s);
  EXPECT_EQ(
      flatten(b.next()),
      flatten(
          DataLoader(data, loader_config(4), 0).collate_units(b.sampler().batch(1, 0), nullptr)));
}

TEST(DataLoader, StateMismatchIsAnInputError) {
  const auto data = make_data(10);
  DataLoader a(data, loader_config(4), 0);
  DataLoader other(make_data(11), loader_config(4), 0);
  try {
    other.set_state(a.state());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("does not match"), std::string::npos);
  }
  EXPECT_THROW(LoaderState::from_json("{\"epoch\":1}"), Error);
  EXPECT_THROW(LoaderState::from_json("not json"), Error);
}

TEST(DataLoader, EpochsCoverAllExamplesInDifferentOrders) {
  const auto data = make_data(50);
  DataLoader a(data, loader_config(5), 0);
  std::vector<std::vector<int64_t>> firsts;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int64_t> starts;
    std::vector<int64_t> order;
    for (int64_t j = 0; j < a.batches_per_epoch(); ++j) {
      const Batch b = a.next();
      const auto ids = b.input_ids.to_i64();
      const auto cu = b.cu_seqlens.to_i64();
      for (size_t s = 0; s + 1 < cu.size(); ++s) {
        starts.insert(ids[static_cast<size_t>(cu[s])] / 1000);
        order.push_back(ids[static_cast<size_t>(cu[s])] / 1000);
      }
    }
    EXPECT_EQ(starts.size(), 50u);
    EXPECT_EQ(std::set<int64_t>(starts.begin(), starts.end()).size(), 50u);
    firsts.push_back(order);
  }
  EXPECT_NE(firsts[0], firsts[1]);
  EXPECT_NE(firsts[1], firsts[2]);
}

TEST(DataLoader, PackedBatchesArePaddingFreeWithReports) {
  auto data = std::make_shared<TokenizedDataset>();
  // Acceptance case 2's lengths as examples: bins [[0(4 of 5)], [2], [1, 3]] at L=4.
  const std::vector<std::vector<int32_t>> seqs = {{1, 2, 3, 4, 5}, {6, 7}, {8, 9, 10, 11}, {12}};
  for (size_t i = 0; i < seqs.size(); ++i) {
    data->add(seqs[i], std::vector<uint8_t>(seqs[i].size(), 1), static_cast<int64_t>(i + 1));
  }
  DataConfig cfg = loader_config(3);
  cfg.max_length = 4;
  cfg.packing = true;
  cfg.shuffle = false;
  cfg.padding_free = false;  // bfd packing forces padding-free, as TRL does
  DataLoader loader(data, cfg, 0);
  ASSERT_NE(loader.packing(), nullptr);
  EXPECT_TRUE(loader.padding_free());
  EXPECT_EQ(loader.num_units(), 3);
  BatchReport report;
  const Batch b = loader.next(&report);
  EXPECT_EQ(b.input_ids.to_i64(), (std::vector<int64_t>{1, 2, 3, 4, 8, 9, 10, 11, 6, 7, 12}));
  EXPECT_EQ(b.position_ids.to_i64(), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 0}));
  EXPECT_EQ(b.labels.to_i64(),
            (std::vector<int64_t>{-100, 2, 3, 4, -100, 9, 10, 11, -100, 7, -100}));
  EXPECT_EQ(b.cu_seqlens.to_i64(), (std::vector<int64_t>{0, 4, 8, 10, 11}));
  EXPECT_EQ(report.real_tokens, 11);
  EXPECT_EQ(report.pad_tokens, 0);
  EXPECT_EQ(report.dropped_tokens, 1);  // the 5 cut by bfd
  EXPECT_EQ(report.label_tokens, 7);
  EXPECT_DOUBLE_EQ(report.efficiency(), 1.0);
  EXPECT_NE(loader.summary().find("3 bins"), std::string::npos) << loader.summary();
}

TEST(DataLoader, WrappedPaddedToMultiple) {
  auto data = std::make_shared<TokenizedDataset>();
  const std::vector<std::vector<int32_t>> seqs = {{1, 2, 3}, {4, 5, 6, 7}, {8}};
  for (size_t i = 0; i < seqs.size(); ++i) {
    data->add(seqs[i], std::vector<uint8_t>(seqs[i].size(), 1), static_cast<int64_t>(i + 1));
  }
  DataConfig cfg = loader_config(3);
  cfg.max_length = 3;
  cfg.packing = true;
  cfg.packing_strategy = "wrapped";
  cfg.shuffle = false;
  cfg.pad_to_multiple_of = 4;
  DataLoader loader(data, cfg, 99);
  EXPECT_FALSE(loader.padding_free());
  BatchReport report;
  const Batch b = loader.next(&report);
  // Three wrapped blocks [1,2,3] [4,5,6] [7,8], each one sequence, padded to 4.
  EXPECT_EQ(b.input_ids.to_i64(), (std::vector<int64_t>{1, 2, 3, 99, 4, 5, 6, 99, 7, 8, 99, 99}));
  EXPECT_EQ(b.cu_seqlens.to_i64(), (std::vector<int64_t>{0, 4, 8, 12}));
  EXPECT_EQ(report.pad_tokens, 4);
  EXPECT_DOUBLE_EQ(report.efficiency(), 8.0 / 12.0);
}

TEST(DataLoader, TruncationShowsAsDroppedTokens) {
  auto data = std::make_shared<TokenizedDataset>();
  data->add(std::vector<int32_t>{1, 2}, std::vector<uint8_t>{1, 1}, 1, /*cut=*/5);
  DataConfig cfg = loader_config(1);
  DataLoader loader(data, cfg, 0);
  BatchReport report;
  loader.next(&report);
  EXPECT_EQ(report.dropped_tokens, 5);
}

}  // namespace
}  // namespace leantune
