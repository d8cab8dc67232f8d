// RowBatches (trainers/common/row_batches.h) on one rank: every row once per epoch in batches of
// the given size (the last one short), a shuffled order that is the same for the same seed and
// epoch and differs between epochs, file order without shuffling, progress, and the data state:
// a round trip resumes at the same micro-batch, a state of another dataset size is refused;
// with drop_last only whole batches, and fewer rows than one batch is an input error. The order
// is EpochSampler's (loaders/data_loader.h), the SFT loader's.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/check.h"
#include "engine/comm.h"
#include "loaders/data_loader.h"
#include "trainers/common/row_batches.h"

namespace leantune {
namespace {

TEST(RowBatches, EveryRowOncePerEpochInBatches) {
  Communicator& comm = world_communicator();
  for (bool shuffle : {false, true}) {
    RowBatches b(19, 4, 7, shuffle, "pairs");
    EXPECT_EQ(b.global_per_epoch(), 5);
    EXPECT_EQ(b.per_epoch(comm), 5);
    std::vector<std::vector<int64_t>> epochs(2);
    for (int e = 0; e < 2; ++e)
      for (int m = 0; m < 5; ++m) {
        const std::vector<int64_t> rows = b.next(comm);
        EXPECT_EQ(rows.size(), m == 4 ? 3u : 4u);
        epochs[e].insert(epochs[e].end(), rows.begin(), rows.end());
      }
    for (auto& e : epochs) {
      std::vector<int64_t> sorted = e;
      std::sort(sorted.begin(), sorted.end());
      for (int64_t i = 0; i < 19; ++i) EXPECT_EQ(sorted[i], i);
    }
    if (shuffle) {
      EXPECT_NE(epochs[0], epochs[1]);
      EXPECT_EQ(RowBatches(19, 4, 7, true, "pairs").rows_of(1, 2), b.rows_of(1, 2));
      EXPECT_NE(RowBatches(19, 4, 8, true, "pairs").rows_of(0, 0), b.rows_of(0, 0));
      // The order is the SFT loader's (one data order for every trainer): rows 8..11 of the
      // sampler's epoch-1 permutation.
      const std::vector<int64_t> order = EpochSampler(19, 4, 7, true).order(1);
      EXPECT_EQ(b.rows_of(1, 2), std::vector<int64_t>(order.begin() + 8, order.begin() + 12));
    } else {
      EXPECT_EQ(b.rows_of(0, 1), (std::vector<int64_t>{4, 5, 6, 7}));
      EXPECT_EQ(epochs[0], epochs[1]);
    }
    EXPECT_DOUBLE_EQ(b.progress(comm), 2.0);
  }
}

TEST(RowBatches, StateResumesAndRefusesAnotherDataset) {
  Communicator& comm = world_communicator();
  RowBatches a(10, 3, 1, true, "examples");
  for (int m = 0; m < 6; ++m) a.next(comm);
  RowBatches b(10, 3, 1, true, "examples");
  b.set_state(a.state(), comm);
  EXPECT_EQ(b.next(comm), a.next(comm));
  EXPECT_DOUBLE_EQ(b.progress(comm), a.progress(comm));
  RowBatches c(11, 3, 1, true, "examples");
  EXPECT_THROW(c.set_state(a.state(), comm), Error);
  EXPECT_THROW(b.set_state(nlohmann::json::array(), comm), Error);
}

// A position is an integer within the epoch: 10 rows in batches of 3 make 4 micro-batches, so
// step_in_epoch 4 (the epoch done) resumes and 5 does not; text and negatives name the key.
TEST(RowBatches, StateOutsideTheEpochIsRefusedNamingTheKey) {
  Communicator& comm = world_communicator();
  RowBatches a(10, 3, 1, true, "examples");
  nlohmann::json s = a.state();
  auto refused = [&](const nlohmann::json& state, const std::string& needle) {
    RowBatches b(10, 3, 1, true, "examples");
    try {
      b.set_state(state, comm);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted " << state.dump();
  };
  s["step_in_epoch"] = 4;
  RowBatches ok(10, 3, 1, true, "examples");
  ok.set_state(s, comm);
  EXPECT_EQ(ok.next(comm), a.rows_of(1, 0));  // the epoch was done: the next one starts
  s["step_in_epoch"] = 5;
  refused(s, "key 'step_in_epoch' is 5, past the 4 micro-batch(es)");
  s["step_in_epoch"] = "one";
  refused(s, "key 'step_in_epoch' must be a non-negative integer, got \"one\"");
  s["step_in_epoch"] = 0;
  s["epoch"] = -1;
  refused(s, "key 'epoch' must be a non-negative integer, got -1");
}

TEST(RowBatches, DropLastUsesOnlyWholeBatches) {
  Communicator& comm = world_communicator();
  RowBatches b(19, 4, 7, true, "prompts", true);
  EXPECT_EQ(b.global_per_epoch(), 4);
  EXPECT_EQ(b.per_epoch(comm), 4);
  std::vector<int64_t> seen;
  for (int m = 0; m < 4; ++m) {
    const std::vector<int64_t> rows = b.next(comm);
    ASSERT_EQ(rows.size(), 4u);
    seen.insert(seen.end(), rows.begin(), rows.end());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end()) << "a row twice in one epoch";
  EXPECT_EQ(b.next(comm), RowBatches(19, 4, 7, true, "prompts").rows_of(1, 0));
  RowBatches few(3, 4, 7, true, "prompts", true);
  EXPECT_EQ(few.per_epoch(comm), 0);
  EXPECT_THROW(few.next(comm), Error);
}

}  // namespace
}  // namespace leantune
