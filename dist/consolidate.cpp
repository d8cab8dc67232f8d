// Optimizer shards merged into whole per-parameter tensors, and data positions moved between
// world sizes (see consolidate.h).
#include "dist/consolidate.h"

#include <algorithm>
#include <cctype>

#include "engine/allocator.h"
#include "engine/check.h"
#include "loaders/fs_util.h"

namespace leantune {
namespace {

using nlohmann::json;

struct PieceRef {
  int64_t begin = 0;
  int64_t length = 0;
  size_t shard = 0;
  Tensor tensor;
};

// Where a rank stands in the stream of global micro-batches.
struct Position {
  bool sft = false;    // the SFT loader's state, else RowBatches'
  int64_t epoch = 0;   // the epoch it is in
  int64_t step = 0;    // micro-batches this rank took in the epoch
  int64_t global = 0;  // global micro-batches per epoch
  const char* step_key = "step";
};

int64_t integer(const json& s, const char* key, const std::string& source) {
  auto it = s.find(key);
  LT_CHECK_INPUT(it != s.end() && it->is_number_integer() && it->get<int64_t>() >= 0, source,
                 ": data_state key '", key, "' must be a non-negative integer");
  return it->get<int64_t>();
}

Position read_position(const json& s, const std::string& source) {
  LT_CHECK_INPUT(s.is_object(), source, ": data_state must be an object");
  LT_CHECK_INPUT(!s.contains("micro_step"), source,
                 ": the online trainers' data state (prompts in whole global batches, a buffered "
                 "generation batch) cannot move to another world size");
  Position p;
  p.epoch = integer(s, "epoch", source);
  if (s.contains("units")) {
    p.sft = true;
    const int64_t units = integer(s, "units", source), batch = integer(s, "batch_size", source);
    LT_CHECK_INPUT(units >= 1 && batch >= 1, source, ": data_state has ", units,
                   " units in batches of ", batch);
    p.global = (units + batch - 1) / batch;
    p.step = integer(s, "step", source);
    return p;
  }
  LT_CHECK_INPUT(s.contains("step_in_epoch"), source,
                 ": data_state is neither the SFT loader's nor RowBatches'");
  LT_CHECK_INPUT(s.contains("global_per_epoch"), source,
                 ": data_state has no 'global_per_epoch' (written before checkpoints recorded "
                 "it); resume it with the world size that wrote it");
  LT_CHECK_INPUT(!s.value("drop_last", false), source,
                 ": data_state drops incomplete global batches; it cannot move to another world "
                 "size");
  p.global = integer(s, "global_per_epoch", source);
  LT_CHECK_INPUT(p.global >= 1, source, ": data_state has no micro-batch per epoch");
  p.step = integer(s, "step_in_epoch", source);
  p.step_key = "step_in_epoch";
  return p;
}

std::string fingerprint(const json& s, bool sft) {
  json f = s;
  for (const char* k : {"epoch", "step", "step_in_epoch", "rank"}) f.erase(k);
  if (sft) f.erase("world_size");
  return f.dump();
}

}  // namespace

std::vector<std::pair<std::string, Shape>> parse_param_shapes(
    const std::map<std::string, std::string>& metadata, const std::string& source) {
  auto it = metadata.find(kParamShapesKey);
  LT_CHECK_INPUT(it != metadata.end(), source, ": no '", kParamShapesKey,
                 "' metadata (an optimizer shard written before it was recorded); resume it with "
                 "the world size and zero_stage that wrote it");
  const json j = parse_json_strict(it->second, source, 8);
  LT_CHECK_INPUT(j.is_array(), source, ": metadata '", kParamShapesKey, "' must be an array");
  std::vector<std::pair<std::string, Shape>> out;
  for (const json& e : j) {
    LT_CHECK_INPUT(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_array(), source,
                   ": metadata '", kParamShapesKey, "' holds ", printable(e.dump(), 60));
    const std::string name = e[0].get<std::string>();
    const json& dims = e[1];
    Shape shape;
    for (const json& d : dims) {
      LT_CHECK_INPUT(d.is_number_integer() && d.get<int64_t>() >= 0, source, ": shape of ", name,
                     " holds ", printable(d.dump(), 30));
      shape.push_back(d.get<int64_t>());
    }
    out.emplace_back(name, std::move(shape));
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> merge_optimizer_shards(
    const std::vector<OptimizerShard>& shards,
    const std::vector<std::pair<std::string, Shape>>& shapes) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < shapes.size(); ++i) index[shapes[i].first] = i;
  // Per parameter: its parts in order of first appearance, each with its pieces.
  std::vector<std::vector<std::pair<std::string, std::vector<PieceRef>>>> parts(shapes.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string& file = shards[s].file;
    for (const auto& [name, t] : shards[s].tensors) {
      const size_t at = name.rfind('@');
      const size_t dot = at == std::string::npos ? at : name.find('.', at);
      const std::string digits =
          dot == std::string::npos ? std::string() : name.substr(at + 1, dot - at - 1);
      LT_CHECK_INPUT(!digits.empty() && digits.size() < 19 &&
                         std::all_of(digits.begin(), digits.end(), ::isdigit) &&
                         dot + 1 < name.size(),
                     file, ": optimizer state '", name, "' is not named <param>@<offset>.<part>");
      const std::string param = name.substr(0, at), part = name.substr(dot + 1);
      auto pi = index.find(param);
      LT_CHECK_INPUT(pi != index.end(), file, ": optimizer state '", name,
                     "' belongs to no trainable parameter (", param, ")");
      const Shape& shape = shapes[pi->second].second;
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      PieceRef piece{std::stoll(digits), t.numel(), s, t};
      LT_CHECK_INPUT(t.is_contiguous() && piece.begin + piece.length <= numel, file,
                     ": optimizer state '", name, "' (", piece.length, " elements) runs past ",
                     param, " (", numel, " elements)");
      auto& mine = parts[pi->second];
      auto it =
          std::find_if(mine.begin(), mine.end(), [&](const auto& e) { return e.first == part; });
      if (it == mine.end()) it = mine.insert(mine.end(), {part, {}});
      it->second.push_back(std::move(piece));
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [param, shape] = shapes[i];
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    for (auto& [part, pieces] : parts[i]) {
      std::sort(pieces.begin(), pieces.end(),
                [](const PieceRef& a, const PieceRef& b) { return a.begin < b.begin; });
      const std::string key = param + "." + part;
      const DType dtype = pieces[0].tensor.dtype();
      Tensor whole = Tensor::empty(shape, dtype, Device::cpu(), MemTag::kOptimizer);
      Tensor flat = whole.view({numel});
      int64_t covered = 0;
      for (size_t k = 0; k < pieces.size(); ++k) {
        const PieceRef& p = pieces[k];
        const std::string& file = shards[p.shard].file;
        LT_CHECK_INPUT(p.tensor.dtype() == dtype, file, ": optimizer state of ", key, " is ",
                       dtype_name(p.tensor.dtype()), " there, ", dtype_name(dtype), " in ",
                       shards[pieces[0].shard].file);
        LT_CHECK_INPUT(p.begin >= covered, file, ": optimizer state of ", key, " covers elements [",
                       p.begin, ", ", std::min(covered, p.begin + p.length), ") that ",
                       shards[pieces[k - 1].shard].file, " covers too");
        LT_CHECK_INPUT(p.begin == covered, file, ": optimizer state of ", key, ": elements [",
                       covered, ", ", p.begin, ") are in no shard");
        if (p.length > 0) flat.narrow(0, p.begin, p.length).copy_(p.tensor.view({p.length}));
        covered = p.begin + p.length;
      }
      LT_CHECK_INPUT(covered == numel, shards[pieces.back().shard].file, ": optimizer state of ",
                     key, ": elements [", covered, ", ", numel, ") are in no shard");
      out.emplace_back(key, std::move(whole));
    }
  }
  return out;
}

MergedDataState merge_data_states(const std::vector<json>& ranks,
                                  const std::vector<std::string>& sources) {
  LT_CHECK(!ranks.empty() && ranks.size() == sources.size(), "merge_data_states: ", ranks.size(),
           " states, ", sources.size(), " sources");
  const int64_t n = static_cast<int64_t>(ranks.size());
  const Position first = read_position(ranks[0], sources[0]);
  const std::string print = fingerprint(ranks[0], first.sft);
  int64_t cont = INT64_MAX, last = 0;
  bool in_step = true;
  std::vector<int64_t> next(ranks.size());
  for (int64_t r = 0; r < n; ++r) {
    const std::string& src = sources[static_cast<size_t>(r)];
    const json& s = ranks[static_cast<size_t>(r)];
    const Position p = read_position(s, src);
    LT_CHECK_INPUT(p.sft == first.sft && fingerprint(s, p.sft) == print, src,
                   ": data_state belongs to other data or options than ", sources[0], "'s");
    if (p.sft)
      LT_CHECK_INPUT(integer(s, "rank", src) == r && integer(s, "world_size", src) == n, src,
                     ": data_state of rank ", s.value("rank", -1), " of ",
                     s.value("world_size", -1), ", expected rank ", r, " of ", n);
    in_step = in_step && p.epoch == first.epoch && p.step == first.step;
    // Its next global micro-batch, on a line through the epochs.
    const int64_t g = p.step * n + r;
    next[static_cast<size_t>(r)] =
        g >= p.global ? (p.epoch + 1) * p.global : p.epoch * p.global + g;
    cont = std::min(cont, next[static_cast<size_t>(r)]);
    last = std::max(last, next[static_cast<size_t>(r)]);
  }
  MergedDataState m;
  m.state = ranks[0];
  m.state["epoch"] = cont / first.global;
  m.state[first.step_key] = cont % first.global;
  if (first.sft) {
    m.state["rank"] = 0;
    m.state["world_size"] = 1;
  }
  const std::string at = "global micro-batch " + std::to_string(cont % first.global) +
                         " of epoch " + std::to_string(cont / first.global);
  if (last >= cont + n)
    m.note = "the ranks' data positions were not one round apart: continuing at " + at +
             ", up to " + std::to_string(last - cont - n + 1) +
             " micro-batch(es) some rank had already taken will be taken again";
  else if (!in_step)
    m.note =
        "the ranks were at different steps of their shards (a run resumed on another world "
        "size); continuing at " +
        at + ", with nothing skipped or repeated";
  return m;
}

json shard_data_state(const json& single, int rank, int world, std::string* note) {
  LT_CHECK(world >= 1 && rank >= 0 && rank < world, "shard_data_state: rank ", rank, " of ", world);
  const std::string source = "the checkpoint";
  const Position p = read_position(single, source);
  if (p.sft)
    LT_CHECK_INPUT(single.value("world_size", -1) == 1 && single.value("rank", -1) == 0, source,
                   ": data_state is not a one-process state");
  int64_t epoch = p.epoch, g = p.step;
  if (g >= p.global) {  // the epoch is done
    ++epoch;
    g = 0;
  }
  json s = single;
  s["epoch"] = epoch;
  s[p.step_key] = (g - rank + world - 1) / world;
  if (p.sft) {
    s["rank"] = rank;
    s["world_size"] = world;
  }
  if (note != nullptr && g % world != 0)
    *note = "data: global micro-batch " + std::to_string(g) + " of epoch " + std::to_string(epoch) +
            " is not a multiple of " + std::to_string(world) + " ranks; ranks 0.." +
            std::to_string(g % world - 1) +
            " start one step further into their shards, so that nothing is skipped or repeated";
  return s;
}

}  // namespace leantune
