// Micro-batches of dataset rows per epoch, sharded over the ranks (see row_batches.h).
#include "trainers/common/row_batches.h"

#include <algorithm>

#include "engine/check.h"

namespace leantune {

RowBatches::RowBatches(int64_t rows, int64_t batch, uint64_t seed, bool shuffle, std::string what,
                       bool drop_last)
    : global_(rows, batch, seed, shuffle, 0, 1, drop_last),
      local_(global_),
      what_(std::move(what)) {
  LT_CHECK(rows >= 0 && batch > 0, "RowBatches: ", rows, " rows in batches of ", batch);
}

const EpochSampler& RowBatches::sampler(const Communicator& comm) const {
  if (local_.rank() != comm.rank() || local_.world_size() != comm.size())
    local_ = EpochSampler(global_.units(), global_.batch_size(), global_.seed(), global_.shuffle(),
                          comm.rank(), comm.size(), global_.drop_last());
  return local_;
}

int64_t RowBatches::global_per_epoch() const { return global_.global_batches_per_epoch(); }

int64_t RowBatches::per_epoch(const Communicator& comm) const {
  return sampler(comm).batches_per_epoch();
}

std::vector<int64_t> RowBatches::rows_of(int64_t epoch, int64_t g) const {
  return global_.global_batch(epoch, g);
}

std::vector<int64_t> RowBatches::next(const Communicator& comm) {
  const EpochSampler& s = sampler(comm);
  LT_CHECK_INPUT(s.batches_per_epoch() > 0, s.units(), " ", what_, ": fewer than one batch of ",
                 s.batch_size() * comm.size(), " (", s.batch_size(), " per rank x ", comm.size(),
                 " ranks)");
  if (step_in_epoch_ >= s.batches_per_epoch()) {
    ++epoch_;
    step_in_epoch_ = 0;
  }
  return s.batch(epoch_, step_in_epoch_++);
}

double RowBatches::progress(const Communicator& comm) const {
  const double per = static_cast<double>(std::max<int64_t>(per_epoch(comm), 1));
  return static_cast<double>(epoch_) + static_cast<double>(step_in_epoch_) / per;
}

nlohmann::json RowBatches::state() const {
  // global_per_epoch and drop_last let a checkpoint's position move to another world size
  // (dist/consolidate.h).
  return {{"epoch", epoch_},
          {"step_in_epoch", step_in_epoch_},
          {what_, global_.units()},
          {"global_per_epoch", global_per_epoch()},
          {"drop_last", global_.drop_last()}};
}

void RowBatches::set_state(const nlohmann::json& s, const Communicator& comm) {
  const int64_t rows = global_.units();
  LT_CHECK_INPUT(s.is_object() && s.value(what_, int64_t{-1}) == rows,
                 "the checkpoint's data state does not belong to this dataset (",
                 s.is_object() ? s.value(what_, int64_t{-1}) : int64_t{-1}, " ", what_, " there, ",
                 rows, " here)");
  auto count = [&](const char* key) {
    auto it = s.find(key);
    LT_CHECK_INPUT(it != s.end() && it->is_number_integer() && it->get<int64_t>() >= 0, "key '",
                   key, "' must be a non-negative integer, got ",
                   it == s.end() ? std::string("nothing") : it->dump());
    return it->get<int64_t>();
  };
  const int64_t epoch = count("epoch"), step = count("step_in_epoch");
  // A position past the epoch's end would be read as the start of the next epoch: the run would
  // go on from data it never reached.
  LT_CHECK_INPUT(step <= per_epoch(comm), "key 'step_in_epoch' is ", step, ", past the ",
                 per_epoch(comm), " micro-batch(es) of an epoch of this dataset on ", comm.size(),
                 " rank(s)");
  epoch_ = epoch;
  step_in_epoch_ = step;
}

}  // namespace leantune
