// dist/consolidate.h: ZeRO optimizer pieces of several ranks merged into whole tensors (values
// at their offsets; a gap, an overlap, an unknown parameter or a malformed name is an Error naming
// the shard file and the parameter), and data positions moved between world sizes: the ranks'
// states merged into the one-process position of the next global micro-batch, which cut again
// for M ranks gives them exactly the next M global micro-batches (EpochSampler's sharding).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "dist/consolidate.h"
#include "engine/check.h"
#include "loaders/data_loader.h"

namespace leantune {
namespace {

using nlohmann::json;

Tensor range(int64_t begin, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(begin + i);
  return Tensor::from_vector(v, {n});
}

std::vector<std::pair<std::string, Shape>> shapes() { return {{"w", {2, 3}}, {"b", {5}}}; }

// "w" (6 elements) and "b" (5) cut as ZeRO stage 2 cuts one unit of 11 elements over 2 ranks
// (slices of 6): rank 0 holds w[0, 6), rank 1 b[0, 5).
std::vector<OptimizerShard> two_ranks() {
  return {{"optimizer_rank_0.safetensors", {{"w@0.exp_avg", range(0, 6)}}},
          {"optimizer_rank_1.safetensors", {{"b@0.exp_avg", range(100, 5)}}}};
}

std::string error_of(const std::vector<OptimizerShard>& shards) {
  try {
    merge_optimizer_shards(shards, shapes());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Consolidate, MergesPiecesAtTheirOffsets) {
  std::vector<OptimizerShard> shards = {
      {"optimizer_rank_0.safetensors", {{"w@0.exp_avg", range(0, 4)}}},
      {"optimizer_rank_1.safetensors",
       {{"w@4.exp_avg", range(4, 2)}, {"b@0.exp_avg", range(6, 3)}}},
      {"optimizer_rank_2.safetensors", {{"b@3.exp_avg", range(9, 2)}}}};
  const auto merged = merge_optimizer_shards(shards, shapes());
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].first, "w.exp_avg");
  EXPECT_EQ(merged[0].second.shape(), (Shape{2, 3}));
  EXPECT_EQ(merged[1].first, "b.exp_avg");
  const float* w = merged[0].second.data<float>();
  const float* b = merged[1].second.data<float>();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w[i], static_cast<float>(i));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b[i], static_cast<float>(6 + i));
  EXPECT_EQ(error_of(two_ranks()), "");
}

TEST(Consolidate, RefusesGapsOverlapsAndStrangers) {
  // A missing piece: the tail of w is in no shard.
  std::string e = error_of({{"optimizer_rank_0.safetensors", {{"w@0.exp_avg", range(0, 4)}}},
                            {"optimizer_rank_1.safetensors", {{"b@0.exp_avg", range(0, 5)}}}});
  EXPECT_NE(e.find("optimizer_rank_0.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("w.exp_avg: elements [4, 6) are in no shard"), std::string::npos) << e;
  // A hole at the start.
  e = error_of({{"optimizer_rank_0.safetensors", {{"w@2.exp_avg", range(0, 4)}}},
                {"optimizer_rank_1.safetensors", {{"b@0.exp_avg", range(0, 5)}}}});
  EXPECT_NE(e.find("w.exp_avg: elements [0, 2) are in no shard"), std::string::npos) << e;
  // Two ranks over the same elements.
  e = error_of({{"optimizer_rank_0.safetensors", {{"w@0.exp_avg", range(0, 4)}}},
                {"optimizer_rank_1.safetensors", {{"w@3.exp_avg", range(0, 3)}}},
                {"optimizer_rank_2.safetensors", {{"b@0.exp_avg", range(0, 5)}}}});
  EXPECT_NE(e.find("optimizer_rank_1.safetensors: optimizer state of w.exp_avg covers elements "
                   "[3, 4) that optimizer_rank_0.safetensors covers too"),
            std::string::npos)
      << e;
  // A piece past the parameter's end.
  e = error_of({{"optimizer_rank_0.safetensors", {{"b@3.exp_avg", range(0, 4)}}}});
  EXPECT_NE(e.find("runs past b"), std::string::npos) << e;
  // Not a trainable parameter, and not a piece name.
  e = error_of({{"optimizer_rank_1.safetensors", {{"v@0.exp_avg", range(0, 4)}}}});
  EXPECT_NE(e.find("optimizer_rank_1.safetensors: optimizer state 'v@0.exp_avg' belongs to no"),
            std::string::npos)
      << e;
  e = error_of({{"optimizer_rank_0.safetensors", {{"w.exp_avg", range(0, 6)}}}});
  EXPECT_NE(e.find("is not named <param>@<offset>.<part>"), std::string::npos) << e;
  // Different dtypes for one part.
  e = error_of(
      {{"optimizer_rank_0.safetensors", {{"w@0.exp_avg", range(0, 4)}}},
       {"optimizer_rank_1.safetensors", {{"w@4.exp_avg", Tensor::zeros({2}, DType::kF64)}}}});
  EXPECT_NE(e.find("f64 there"), std::string::npos) << e;
}

TEST(Consolidate, ParamShapesMetadata) {
  const auto s = parse_param_shapes({{kParamShapesKey, R"([["w", [2, 3]], ["b", [5]]])"}}, "f");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].first, "w");
  EXPECT_EQ(s[0].second, (Shape{2, 3}));
  EXPECT_THROW(parse_param_shapes({}, "f"), Error);
  EXPECT_THROW(parse_param_shapes({{kParamShapesKey, R"({"w": [2]})"}}, "f"), Error);
}

json sft_state(int64_t units, int64_t batch, int64_t epoch, int64_t step, int rank, int world) {
  return json::parse(LoaderState{epoch, step, units, batch, 7, true, rank, world}.to_json());
}

// The next global micro-batch (epoch * global + g) each rank of `world` takes from its state (in
// an epoch's last round, the wrap-around to its first micro-batches).
std::vector<int64_t> next_globals(const std::vector<json>& states, int64_t units, int64_t batch) {
  std::vector<int64_t> out;
  const int world = static_cast<int>(states.size());
  const int64_t global = (units + batch - 1) / batch;
  for (int r = 0; r < world; ++r) {
    EpochSampler s(units, batch, 7, true, r, world);
    int64_t epoch = states[r]["epoch"], step = states[r]["step"];
    if (step >= s.batches_per_epoch()) {
      ++epoch;
      step = 0;
    }
    out.push_back(epoch * global + (step * world + r) % global);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Consolidate, DataPositionMovesToAnyWorldSize) {
  const int64_t units = 37, batch = 2, global = 19;
  for (int n = 1; n <= 4; ++n) {
    const int64_t per_rank = (global + n - 1) / n;
    for (int64_t step = 0; step <= per_rank; ++step) {
      std::vector<json> ranks;
      std::vector<std::string> sources;
      for (int r = 0; r < n; ++r) {
        ranks.push_back(sft_state(units, batch, 1, step, r, n));
        sources.push_back("rank_" + std::to_string(r) + ".json");
      }
      const MergedDataState m = merge_data_states(ranks, sources);
      EXPECT_EQ(m.note, "");
      EXPECT_EQ(m.state["world_size"], 1);
      const int64_t at = m.state["epoch"].get<int64_t>() * global + m.state["step"].get<int64_t>();
      EXPECT_EQ(at, step * n >= global ? 2 * global : global + step * n) << n << " " << step;
      for (int world = 1; world <= 5; ++world) {
        std::vector<json> cut;
        for (int r = 0; r < world; ++r) cut.push_back(shard_data_state(m.state, r, world, nullptr));
        // The next `world` global micro-batches, unless the epoch ends (then its wrap-around).
        const std::vector<int64_t> next = next_globals(cut, units, batch);
        for (int k = 0; k < world; ++k)
          if (at % global + k < global) {
            EXPECT_EQ(std::count(next.begin(), next.end(), at + k), 1) << n << " " << step;
          }
        // Merged back, the position is where it was.
        std::vector<std::string> src(static_cast<size_t>(world), "r");
        const MergedDataState back = merge_data_states(cut, src);
        EXPECT_EQ(back.state, m.state) << n << " " << step << " " << world;
      }
    }
  }
}

TEST(Consolidate, RowBatchesStateAndRefusals) {
  const json rows = {{"epoch", 0},
                     {"step_in_epoch", 3},
                     {"pairs", 20},
                     {"global_per_epoch", 10},
                     {"drop_last", false}};
  const MergedDataState m = merge_data_states({rows, rows}, {"rank_0.json", "rank_1.json"});
  EXPECT_EQ(m.state["step_in_epoch"], 6);
  std::string note;
  const json r1 = shard_data_state(m.state, 1, 4, &note);
  EXPECT_EQ(r1["step_in_epoch"], 2);  // 6 = 4 + 2: ranks 0 and 1 take 8 and 9, ranks 2, 3 6 and 7
  EXPECT_EQ(shard_data_state(m.state, 2, 4, nullptr)["step_in_epoch"], 1);
  EXPECT_NE(note.find("ranks 0..1 start one step further"), std::string::npos) << note;
  json online = rows;
  online["micro_step"] = 2;
  EXPECT_THROW(merge_data_states({online}, {"rank_0.json"}), Error);
  json old = rows;
  old.erase("global_per_epoch");
  EXPECT_THROW(shard_data_state(old, 0, 2, nullptr), Error);
  // Ranks of different data.
  json other = rows;
  other["pairs"] = 21;
  EXPECT_THROW(merge_data_states({rows, other}, {"a", "b"}), Error);
}

}  // namespace
}  // namespace leantune
