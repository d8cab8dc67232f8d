// Micro-batches of dataset rows per epoch, sharded over the ranks (see row_batches.h).
#include "trainers/common/row_batches.h"

#include <algorithm>
#include <random>

#include "engine/check.h"

namespace leantune {

RowBatches::RowBatches(int64_t rows, int64_t batch, uint64_t seed, bool shuffle, std::string what,
                       bool drop_last)
    : rows_(rows),
      batch_(batch),
      seed_(seed),
      shuffle_(shuffle),
      what_(std::move(what)),
      drop_last_(drop_last) {
  LT_CHECK(rows >= 0 && batch > 0, "RowBatches: ", rows, " rows in batches of ", batch);
}

int64_t RowBatches::global_per_epoch() const {
  return drop_last_ ? rows_ / batch_ : (rows_ + batch_ - 1) / batch_;
}

int64_t RowBatches::per_epoch(const Communicator& comm) const {
  const int64_t world = comm.size();
  if (drop_last_) return rows_ / (batch_ * world);
  return (global_per_epoch() + world - 1) / world;
}

std::vector<int64_t> RowBatches::order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(rows_));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  if (!shuffle_) return order;
  std::mt19937_64 gen(seed_ * 1000003ULL + static_cast<uint64_t>(epoch));
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(gen() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

std::vector<int64_t> RowBatches::rows_of(int64_t epoch, int64_t g) const {
  const std::vector<int64_t> o = order(epoch);
  const int64_t b = std::min(rows_, g * batch_), e = std::min(rows_, (g + 1) * batch_);
  return {o.begin() + b, o.begin() + e};
}

std::vector<int64_t> RowBatches::next(const Communicator& comm) {
  LT_CHECK_INPUT(per_epoch(comm) > 0, rows_, " ", what_, ": fewer than one batch of ",
                 batch_ * comm.size(), " (", batch_, " per rank x ", comm.size(), " ranks)");
  if (step_in_epoch_ >= per_epoch(comm)) {
    ++epoch_;
    step_in_epoch_ = 0;
  }
  const int64_t g =
      (step_in_epoch_ * comm.size() + comm.rank()) % std::max<int64_t>(1, global_per_epoch());
  ++step_in_epoch_;
  return rows_of(epoch_, g);
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
          {what_, rows_},
          {"global_per_epoch", global_per_epoch()},
          {"drop_last", drop_last_}};
}

void RowBatches::set_state(const nlohmann::json& s, const Communicator& comm) {
  LT_CHECK_INPUT(s.is_object() && s.value(what_, int64_t{-1}) == rows_,
                 "the checkpoint's data state does not belong to this dataset (",
                 s.is_object() ? s.value(what_, int64_t{-1}) : int64_t{-1}, " ", what_, " there, ",
                 rows_, " here)");
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
