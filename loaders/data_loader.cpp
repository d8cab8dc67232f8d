// Epoch order, sharding, micro-batching and resumable state (see data_loader.h).
#include "loaders/data_loader.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "engine/rng.h"

namespace leantune {

EpochSampler::EpochSampler(int64_t units, int64_t batch_size, uint64_t seed, bool shuffle, int rank,
                           int world_size, bool drop_last)
    : units_(units),
      batch_size_(batch_size),
      seed_(seed),
      shuffle_(shuffle),
      rank_(rank),
      world_(world_size),
      drop_last_(drop_last) {
  LT_CHECK_INPUT(batch_size >= 1, "per_device_train_batch_size must be >= 1, got ", batch_size);
  LT_CHECK_INPUT(world_size >= 1 && rank >= 0 && rank < world_size, "data sharding: rank ", rank,
                 " of world size ", world_size);
  LT_CHECK(units >= 0, "negative unit count");
  global_batches_ = drop_last ? units / batch_size : (units + batch_size - 1) / batch_size;
  per_rank_ =
      drop_last ? global_batches_ / world_size : (global_batches_ + world_size - 1) / world_size;
}

void EpochSampler::ensure_order(int64_t epoch) const {
  if (cached_epoch_ == epoch) return;
  cached_order_.resize(static_cast<size_t>(units_));
  for (int64_t i = 0; i < units_; ++i) cached_order_[static_cast<size_t>(i)] = i;
  if (shuffle_ && units_ > 1) {
    // One stream per epoch: offset epoch << 40 leaves room for 2^40 draws per epoch.
    Generator gen(seed_, RngPurpose::kDataOrder, 0);
    gen.set_offset(static_cast<uint64_t>(epoch) << 40);
    for (int64_t i = units_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(i + 1)));
      std::swap(cached_order_[static_cast<size_t>(i)], cached_order_[static_cast<size_t>(j)]);
    }
  }
  cached_epoch_ = epoch;
}

std::vector<int64_t> EpochSampler::order(int64_t epoch) const {
  ensure_order(epoch);
  return cached_order_;
}

std::vector<int64_t> EpochSampler::batch(int64_t epoch, int64_t j) const {
  LT_CHECK(j >= 0 && j < per_rank_, "batch ", j, " of ", per_rank_);
  return global_batch(epoch, (j * world_ + rank_) % global_batches_);
}

std::vector<int64_t> EpochSampler::global_batch(int64_t epoch, int64_t g) const {
  LT_CHECK(g >= 0 && (g < global_batches_ || (g == 0 && global_batches_ == 0)), "global batch ", g,
           " of ", global_batches_);
  ensure_order(epoch);
  const int64_t begin = std::min(units_, g * batch_size_);
  const int64_t end = std::min(units_, begin + batch_size_);
  return std::vector<int64_t>(cached_order_.begin() + begin, cached_order_.begin() + end);
}

std::string LoaderState::to_json() const {
  nlohmann::json j = {
      {"epoch", epoch}, {"step", step},       {"units", units}, {"batch_size", batch_size},
      {"seed", seed},   {"shuffle", shuffle}, {"rank", rank},   {"world_size", world_size}};
  return j.dump();
}

LoaderState LoaderState::from_json(const std::string& text) {
  LoaderState s;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    s.epoch = j.at("epoch").get<int64_t>();
    s.step = j.at("step").get<int64_t>();
    s.units = j.at("units").get<int64_t>();
    s.batch_size = j.at("batch_size").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.shuffle = j.at("shuffle").get<bool>();
    s.rank = j.at("rank").get<int>();
    s.world_size = j.at("world_size").get<int>();
  } catch (const nlohmann::json::exception& e) {
    LT_THROW(ErrorKind::kInput, "data loader state: ", e.what());
  }
  LT_CHECK_INPUT(s.epoch >= 0, "key 'epoch' must be a non-negative integer, got ", s.epoch);
  LT_CHECK_INPUT(s.step >= 0, "key 'step' must be a non-negative integer, got ", s.step);
  return s;
}

DataLoader::DataLoader(std::shared_ptr<const TokenizedDataset> data, const DataConfig& cfg,
                       int32_t pad_token_id, int rank, int world_size)
    : data_(std::move(data)), sampler_(0, 1, 0, false) {
  LT_CHECK(data_ != nullptr, "DataLoader: null data");
  validate_data_config(cfg);
  packed_ = cfg.packing;
  int64_t units = data_->size();
  if (packed_) {
    const std::vector<int64_t> lengths = data_->lengths();
    packing_ = pack_lengths(lengths, cfg.max_length, parse_packing_strategy(cfg.packing_strategy),
                            cfg.packing_window);
    units = packing_.num_bins();
  }
  collate_.padding_free = resolve_padding_free(cfg);
  collate_.pad_to_multiple_of = cfg.pad_to_multiple_of;
  collate_.pad_token_id = pad_token_id;
  sampler_ =
      EpochSampler(units, cfg.per_device_train_batch_size, cfg.seed, cfg.shuffle, rank, world_size);
  LT_CHECK_INPUT(units > 0, "the dataset has no example to train on");
}

Row DataLoader::unit_row(int64_t unit) const {
  Row row;
  if (!packed_) {
    const auto ids = data_->ids(unit);
    const auto mask = data_->mask(unit);
    row.input_ids.assign(ids.begin(), ids.end());
    row.loss_mask.assign(mask.begin(), mask.end());
    return row;
  }
  row.input_ids.reserve(static_cast<size_t>(packing_.bin_lengths[static_cast<size_t>(unit)]));
  row.loss_mask.reserve(row.input_ids.capacity());
  for (const Segment& s : packing_.bin(unit)) {
    const auto ids =
        data_->ids(s.item).subspan(static_cast<size_t>(s.begin), static_cast<size_t>(s.length));
    const auto mask =
        data_->mask(s.item).subspan(static_cast<size_t>(s.begin), static_cast<size_t>(s.length));
    row.input_ids.insert(row.input_ids.end(), ids.begin(), ids.end());
    row.loss_mask.insert(row.loss_mask.end(), mask.begin(), mask.end());
  }
  if (!packing_.bin_is_one_sequence()) row.seq_lengths = packing_.seq_lengths(unit);
  return row;
}

int64_t DataLoader::unit_dropped_tokens(int64_t unit) const {
  if (!packed_) return data_->cut(unit);
  int64_t dropped = 0;
  for (const Segment& s : packing_.bin(unit)) {
    dropped += data_->cut(s.item);
    // A bfd segment that starts an item but does not reach its end lost the overflow.
    if (packing_.strategy == PackingStrategy::kBfd && s.begin == 0) {
      dropped += data_->length(s.item) - s.length;
    }
  }
  return dropped;
}

Batch DataLoader::collate_units(const std::vector<int64_t>& units, BatchReport* report) const {
  std::vector<Row> rows;
  rows.reserve(units.size());
  int64_t dropped = 0;
  for (int64_t u : units) {
    rows.push_back(unit_row(u));
    dropped += unit_dropped_tokens(u);
  }
  Batch b = collate(rows, collate_);
  if (report != nullptr) *report = make_report(b, dropped);
  return b;
}

Batch DataLoader::next(BatchReport* report) {
  if (step_ >= sampler_.batches_per_epoch()) {
    ++epoch_;
    step_ = 0;
  }
  Batch b = collate_units(sampler_.batch(epoch_, step_), report);
  ++step_;
  return b;
}

LoaderState DataLoader::state() const {
  LoaderState s;
  s.epoch = epoch_;
  s.step = step_;
  s.units = sampler_.units();
  s.batch_size = sampler_.batch_size();
  s.seed = sampler_.seed();
  s.shuffle = sampler_.shuffle();
  s.rank = sampler_.rank();
  s.world_size = sampler_.world_size();
  return s;
}

void DataLoader::set_state(const LoaderState& s) {
  LT_CHECK_INPUT(s.units == sampler_.units() && s.batch_size == sampler_.batch_size() &&
                     s.seed == sampler_.seed() && s.shuffle == sampler_.shuffle() &&
                     s.rank == sampler_.rank() && s.world_size == sampler_.world_size(),
                 "data loader state does not match this run: saved units ", s.units,
                 ", batch size ", s.batch_size, ", seed ", s.seed, ", shuffle ", s.shuffle,
                 ", rank ", s.rank, "/", s.world_size, "; now units ", sampler_.units(),
                 ", batch size ", sampler_.batch_size(), ", seed ", sampler_.seed(), ", shuffle ",
                 sampler_.shuffle(), ", rank ", sampler_.rank(), "/", sampler_.world_size());
  // A position past the epoch's end would be read as the start of the next epoch.
  LT_CHECK_INPUT(s.step <= sampler_.batches_per_epoch(), "key 'step' is ", s.step, ", past the ",
                 sampler_.batches_per_epoch(), " micro-batch(es) of an epoch of this dataset");
  epoch_ = s.epoch;
  step_ = s.step;
}

std::string DataLoader::summary() const {
  char buf[512];
  if (packed_) {
    std::snprintf(buf, sizeof(buf),
                  "packing %s (max_length %lld): %lld examples -> %lld bins, efficiency %.4f, "
                  "%lld tokens dropped; ",
                  packing_strategy_name(packing_.strategy),
                  static_cast<long long>(packing_.max_length),
                  static_cast<long long>(data_->size() - packing_.empty_items),
                  static_cast<long long>(packing_.num_bins()), packing_.efficiency(),
                  static_cast<long long>(packing_.dropped_tokens));
  } else {
    std::snprintf(buf, sizeof(buf), "no packing: %lld examples; ",
                  static_cast<long long>(data_->size()));
  }
  std::string s = buf;
  std::snprintf(
      buf, sizeof(buf), "%s; %lld micro-batches of %lld per epoch on rank %d/%d (%lld repeated)",
      collate_.padding_free ? "padding-free" : "padded",
      static_cast<long long>(sampler_.batches_per_epoch()),
      static_cast<long long>(sampler_.batch_size()), sampler_.rank(), sampler_.world_size(),
      static_cast<long long>(sampler_.repeated_batches_per_epoch()));
  return s + buf;
}

}  // namespace leantune
