// The context-parallel batch split (dist/context_parallel.h) against an independent
// reference: every real row of the global batch lands on exactly one rank, with its id, its
// position and its next-token target computed on the global batch; pads carry the pad id and
// no target; the local label counts sum to the global one.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "dist/context_parallel.h"
#include "engine/check.h"

namespace leantune {
namespace {

struct SplitCase {
  std::string name;
  std::vector<int64_t> lengths;
  int cp;
};

// Sequence s, row p: id 1000*s + p + 1, label = id except at every third row (-100), the first
// row of a sequence -100 as padding-free collation leaves it.
Batch make_batch(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu{0};
  for (size_t s = 0; s < lengths.size(); ++s) {
    for (int64_t p = 0; p < lengths[s]; ++p) {
      const int64_t id = 1000 * static_cast<int64_t>(s) + p + 1;
      ids.push_back(id);
      pos.push_back(p);
      labels.push_back(p == 0 || p % 3 == 2 ? -100 : id);
    }
    cu.push_back(cu.back() + static_cast<int32_t>(lengths[s]));
  }
  Batch b;
  const auto t = static_cast<int64_t>(ids.size());
  b.input_ids = Tensor::from_vector(ids, {t});
  b.position_ids = Tensor::from_vector(pos, {t});
  b.labels = Tensor::from_vector(labels, {t});
  b.cu_seqlens = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  b.stats.sequences = static_cast<int64_t>(lengths.size());
  return b;
}

class ContextParallelSplit : public ::testing::TestWithParam<SplitCase> {};

TEST_P(ContextParallelSplit, RowsTargetsAndCountsMatchTheGlobalBatch) {
  const SplitCase& c = GetParam();
  const Batch g = make_batch(c.lengths);
  const int64_t pad = 7;
  // Reference targets: labels[t+1] inside a sequence, written out directly.
  std::map<int64_t, int64_t> target_of_id;  // id -> target
  int64_t global_targets = 0, row = 0;
  const std::vector<int64_t> labels = g.labels.to_i64();
  for (size_t s = 0; s < c.lengths.size(); ++s) {
    for (int64_t p = 0; p < c.lengths[s]; ++p, ++row) {
      const int64_t tgt = p + 1 < c.lengths[s] ? labels[row + 1] : -100;
      target_of_id[1000 * static_cast<int64_t>(s) + p + 1] = tgt;
      global_targets += tgt != -100;
    }
  }
  std::map<int64_t, int> seen;
  int64_t sum_targets = 0;
  for (int r = 0; r < c.cp; ++r) {
    const ContextParallelBatch split = split_context_parallel(g, c.cp, r, pad, nullptr);
    const Batch& b = split.local;
    const std::vector<int64_t> ids = b.input_ids.to_i64(), pos = b.position_ids.to_i64(),
                               tgt = b.labels.to_i64(), cu = b.cu_seqlens.to_i64();
    ASSERT_EQ(cu.size(), c.lengths.size() + 1);
    int64_t local_targets = 0;
    for (size_t s = 0; s < c.lengths.size(); ++s) {
      const int64_t padded = (c.lengths[s] + 2 * c.cp - 1) / (2 * c.cp) * (2 * c.cp);
      ASSERT_EQ(cu[s + 1] - cu[s], padded / c.cp) << "sequence " << s;
      const int64_t chunk = padded / (2 * c.cp);
      for (int64_t j = cu[s]; j < cu[s + 1]; ++j) {
        const int64_t i = j - cu[s];
        // Chunks r and 2cp-1-r of the padded sequence, in order.
        const int64_t p = i < chunk ? r * chunk + i : (2 * c.cp - 1 - r) * chunk + (i - chunk);
        ASSERT_EQ(pos[j], p) << "rank " << r << " row " << j;
        if (p < c.lengths[s]) {
          const int64_t id = 1000 * static_cast<int64_t>(s) + p + 1;
          ASSERT_EQ(ids[j], id);
          ASSERT_EQ(tgt[j], target_of_id.at(id)) << "id " << id;
          ++seen[id];
        } else {
          ASSERT_EQ(ids[j], pad);
          ASSERT_EQ(tgt[j], -100);
        }
        local_targets += tgt[j] != -100;
      }
    }
    EXPECT_EQ(b.stats.label_tokens, local_targets);
    EXPECT_EQ(context_parallel_label_tokens(g, c.cp, r), local_targets);
    EXPECT_EQ(split.context->layout.rank, r);
    sum_targets += local_targets;
  }
  EXPECT_EQ(seen.size(), target_of_id.size());
  for (const auto& [id, n] : seen) EXPECT_EQ(n, 1) << "id " << id;
  EXPECT_EQ(sum_targets, global_targets);
  EXPECT_GT(global_targets, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, ContextParallelSplit,
                         ::testing::Values(SplitCase{"one_sequence_cp2", {8}, 2},
                                           SplitCase{"awkward_lengths_cp2", {5, 1, 19}, 2},
                                           SplitCase{"awkward_lengths_cp3", {5, 1, 19, 71}, 3},
                                           SplitCase{"cp4_exact_multiple", {16, 24}, 4}),
                         [](const ::testing::TestParamInfo<SplitCase>& i) { return i.param.name; });

TEST(ContextParallelOptions, PadMultiple) {
  EXPECT_EQ(context_parallel_pad_multiple(1, 0), 0);
  EXPECT_EQ(context_parallel_pad_multiple(1, 3), 3);
  EXPECT_EQ(context_parallel_pad_multiple(2, 0), 4);
  EXPECT_EQ(context_parallel_pad_multiple(4, 16), 16);
  EXPECT_THROW(context_parallel_pad_multiple(2, 6), Error);
}

}  // namespace
}  // namespace leantune
