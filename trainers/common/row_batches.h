// The position of the trainers that batch whole dataset rows (dpo, kto, reward, and the prompts
// of the online trainers' generation batches) over the data order every trainer shares
// (loaders/data_loader.h EpochSampler): `batch` rows each, the epoch's rows in the sampler's
// shuffled order (Philox keyed by (seed, epoch): the same order on every machine and on resume)
// or in file order (kto, as TRL's KTOTrainer samples sequentially). Data parallel: global
// micro-batch g of an epoch goes to rank g % world; every rank takes ceil(global / world) of them,
// the last ranks wrapping to the epoch's first micro-batches, as the SFT data loader does. The
// position (epoch, micro-batch within it), with the global micro-batches per epoch, is the
// checkpoint's data state.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/comm.h"
#include "loaders/data_loader.h"

namespace leantune {

class RowBatches {
 public:
  // what: the name the data state gives the rows ("pairs", "examples").
  // drop_last: only whole global batches (batch x world rows) are used in an epoch, the rest
  // of the rows wait for a later epoch's order, as TRL's RepeatSampler drops incomplete chunks
  // (the online trainers); without it the last batch may be short and the last ranks wrap.
  RowBatches(int64_t rows, int64_t batch, uint64_t seed, bool shuffle, std::string what,
             bool drop_last = false);
  int64_t global_per_epoch() const;
  int64_t per_epoch(const Communicator& comm) const;
  // The rows of global micro-batch g of an epoch.
  std::vector<int64_t> rows_of(int64_t epoch, int64_t g) const;
  // The rows of this rank's next micro-batch; moves to the next epoch when this one is done.
  std::vector<int64_t> next(const Communicator& comm);
  // Epochs done, with the current one's fraction.
  double progress(const Communicator& comm) const;
  nlohmann::json state() const;
  // Error(kInput) naming the key when the state belongs to a dataset of another size, a position
  // is not a non-negative integer, or step_in_epoch lies past this rank's micro-batches of an
  // epoch.
  void set_state(const nlohmann::json& s, const Communicator& comm);

 private:
  // The sampler of this rank (made again when the communicator changes).
  const EpochSampler& sampler(const Communicator& comm) const;
  EpochSampler global_;  // rank 0 of 1: the global micro-batches
  mutable EpochSampler local_;
  std::string what_;
  int64_t epoch_ = 0, step_in_epoch_ = 0;
};

}  // namespace leantune
