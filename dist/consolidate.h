// A data-parallel or ZeRO checkpoint re-cut into the single-process form, and that form cut again
// for any number of ranks: what `trainer_bin consolidate` and a resume on another world size need.
//
// Optimizer: ZeRO ranks save the inner optimizer's state of their pieces, "<param>@<offset>.<part>"
// (dist/zero.h), with the shapes of the trainable parameters in the file's metadata
// (kParamShapesKey). merge_optimizer_shards puts each piece back at its offset of a whole
// "<param>.<part>" tensor (the names a one-process AdamW or SGD saves) and checks that every
// element of every saved part is covered exactly once. ZeroOptimizer::load_state_tensors narrows
// the whole tensors back to a rank's pieces, for any world size.
//
// Data position: global micro-batch g of an epoch goes to rank g % N (loaders/data_loader.h,
// trainers/common/row_batches.h), so rank r's state (epoch, step) means its next micro-batch is
// g = step * N + r. merge_data_states takes the smallest such g over the ranks (an epoch whose
// micro-batches are all taken continues at the next epoch's first) as the position of a
// one-process run: every micro-batch before it was taken, none after it. shard_data_state cuts a
// one-process position G for rank r of M: step ceil((G - r) / M), so the ranks' next micro-batches
// are G, G+1, ..., G+M-1, exactly the stream's continuation. When M does not divide G the first
// G % M ranks are one step further into their shards than the others; nothing is skipped or
// repeated (the ranks' epoch ends fall one round apart; the wrap-around of an epoch whose
// micro-batches do not divide by M repeats its first ones as in any M-rank run). Supported: the
// SFT loader's state and RowBatches' (dpo, kto, reward); the online trainers' state (a buffered
// generation batch, prompts in whole global batches) is refused.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace leantune {

// Metadata key of an optimizer shard: JSON [["<param>", [dims...]], ...], every trainable
// parameter in the optimizer's order.
constexpr const char* kParamShapesKey = "param_shapes";

struct OptimizerShard {
  std::string file;  // for errors
  std::vector<std::pair<std::string, Tensor>> tensors;
};

// Whole "<param>.<part>" tensors (host, MemTag::kOptimizer) from the pieces of all ranks, in the
// order of `shapes`' parameters. Error(kInput), one line naming the file and the parameter: a
// name that is not "<param>@<offset>.<part>", an unknown parameter, a piece outside it, pieces of
// one part in different dtypes, two pieces over the same element, or elements no piece covers.
std::vector<std::pair<std::string, Tensor>> merge_optimizer_shards(
    const std::vector<OptimizerShard>& shards,
    const std::vector<std::pair<std::string, Shape>>& shapes);

// kParamShapesKey's value parsed (Error(kInput) naming `source` when absent or malformed).
std::vector<std::pair<std::string, Shape>> parse_param_shapes(
    const std::map<std::string, std::string>& metadata, const std::string& source);

struct MergedDataState {
  nlohmann::json state;  // the one-process data state
  std::string note;      // what the log should say ("" when the ranks were in step)
};
// The data states of ranks 0..N-1 (sources: their files, for errors) as one process's.
MergedDataState merge_data_states(const std::vector<nlohmann::json>& ranks,
                                  const std::vector<std::string>& sources);

// A one-process data state as rank `rank` of `world` resumes it; *note (may be null) gets a line
// for the log when the ranks start at different steps of their shards.
nlohmann::json shard_data_state(const nlohmann::json& single, int rank, int world,
                                std::string* note);

}  // namespace leantune
