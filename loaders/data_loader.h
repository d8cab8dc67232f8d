// Data order, sharding and micro-batches over tokenised examples, with a resumable state.
//
// Units: the packed bins when packing, else the examples. Per epoch:
//   order     a Fisher-Yates shuffle of the units driven by Generator(seed, kDataOrder) whose
//             offset starts at epoch << 40, so every epoch is reproducible on its own (and
//             independent of how many epochs ran before); shuffle=false keeps the input order.
//             Every rank computes the same order (the generator's rank is 0 for data order).
//   batches   consecutive groups of per_device_train_batch_size units of that order; the last
//             group may be smaller, or with drop_last only whole groups are used (the rest of
//             the units wait for a later epoch's order, as TRL's RepeatSampler drops incomplete
//             chunks) and every rank takes floor(global / world_size) of them.
//   sharding  global batch g goes to rank g % world_size ("every w-th micro-batch"). All ranks
//             take the same number, ceil(global / world_size): when that does not divide, the
//             missing slots of the last round wrap around to the first batches of the epoch
//             (accelerate's even_batches) and are counted in repeated_batches_per_epoch().
//             With world_size 1 every batch is seen exactly once.
//   state     (epoch, step) where step = micro-batches this rank has taken in the epoch, plus a
//             fingerprint (units, batch size, seed, shuffle, rank, world size). Restoring a state
//             into a loader built on the same data gives byte-identical next batches.
//
// API
//   EpochSampler s(units, batch_size, seed, shuffle, rank, world);   // pure index logic, the
//                                     // one data order of every trainer (trainers/common/
//                                     // row_batches.h keeps the others' position over it)
//   s.batches_per_epoch(); s.batch(epoch, j) -> unit indices
//   DataLoader loader(data, cfg, pad_token_id, rank, world);         // SFT micro-batches
//   Batch b = loader.next(&report);   // moves to the next epoch after the last batch
//   LoaderState st = loader.state(); loader.set_state(st); st.to_json(); LoaderState::from_json
//   loader.packing() (null without packing), loader.summary()
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loaders/batch.h"
#include "loaders/collate.h"
#include "loaders/data_config.h"
#include "loaders/examples.h"
#include "loaders/pack.h"

namespace leantune {

class EpochSampler {
 public:
  EpochSampler(int64_t units, int64_t batch_size, uint64_t seed, bool shuffle, int rank = 0,
               int world_size = 1, bool drop_last = false);

  int64_t units() const { return units_; }
  int64_t global_batches_per_epoch() const { return global_batches_; }
  int64_t batches_per_epoch() const { return per_rank_; }  // for this rank
  int64_t repeated_batches_per_epoch() const {
    return per_rank_ * world_ > global_batches_ ? per_rank_ * world_ - global_batches_ : 0;
  }
  // The unit order of an epoch (a permutation of 0..units-1).
  std::vector<int64_t> order(int64_t epoch) const;
  // Units of this rank's j-th micro-batch of `epoch` (0 <= j < batches_per_epoch()).
  std::vector<int64_t> batch(int64_t epoch, int64_t j) const;
  // Units of global micro-batch g of `epoch` (0 <= g < global_batches_per_epoch(); g 0 of an
  // empty epoch is empty).
  std::vector<int64_t> global_batch(int64_t epoch, int64_t g) const;

  uint64_t seed() const { return seed_; }
  bool shuffle() const { return shuffle_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int64_t batch_size() const { return batch_size_; }
  bool drop_last() const { return drop_last_; }

 private:
  void ensure_order(int64_t epoch) const;

  int64_t units_;
  int64_t batch_size_;
  uint64_t seed_;
  bool shuffle_;
  int rank_;
  int world_;
  bool drop_last_;
  int64_t global_batches_;
  int64_t per_rank_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

struct LoaderState {
  int64_t epoch = 0;
  int64_t step = 0;  // micro-batches already taken by this rank in `epoch`
  // Fingerprint of the loader that wrote the state.
  int64_t units = 0;
  int64_t batch_size = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  int rank = 0;
  int world_size = 1;

  std::string to_json() const;
  // Throws Error(kInput) on a malformed state.
  static LoaderState from_json(const std::string& text);
};

class DataLoader {
 public:
  // Packs the examples when cfg.packing (strategy, max_length, packing_window) and collates
  // per cfg (padding_free resolved as TRL, pad_to_multiple_of).
  DataLoader(std::shared_ptr<const TokenizedDataset> data, const DataConfig& cfg,
             int32_t pad_token_id, int rank = 0, int world_size = 1);

  // The next micro-batch of this rank; after the last one of an epoch the next call starts the
  // following epoch. report (optional) gets the batch's token counts and dropped tokens.
  Batch next(BatchReport* report = nullptr);

  int64_t epoch() const { return epoch_; }
  int64_t step_in_epoch() const { return step_; }
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  int64_t num_units() const { return sampler_.units(); }
  const EpochSampler& sampler() const { return sampler_; }
  const Packing* packing() const { return packed_ ? &packing_ : nullptr; }
  bool padding_free() const { return collate_.padding_free; }

  LoaderState state() const;
  // Throws Error(kInput) when the state was written by a loader over other data or options.
  void set_state(const LoaderState& state);

  // The row of one unit (bin or example), as collate() receives it.
  Row unit_row(int64_t unit) const;
  // Tokens of the unit's examples lost to truncation or bfd overflow.
  int64_t unit_dropped_tokens(int64_t unit) const;
  // Collates the given units (used by next(); exposed for tests and evaluation).
  Batch collate_units(const std::vector<int64_t>& units, BatchReport* report) const;

  // "packing bfd: 1000 examples -> 230 bins, efficiency 0.97; 29 micro-batches of 8 per epoch"
  std::string summary() const;

 private:
  std::shared_ptr<const TokenizedDataset> data_;
  bool packed_ = false;
  Packing packing_;
  CollateOptions collate_;
  EpochSampler sampler_;
  int64_t epoch_ = 0;
  int64_t step_ = 0;
};

}  // namespace leantune
