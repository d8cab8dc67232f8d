// `trainer_bin consolidate CHECKPOINT --out DIR`: a data-parallel or ZeRO checkpoint as the
// checkpoint one process would have written at the same step: a plain model folder for
// transformers/PEFT, and a checkpoint that resumes on any number of ranks and any zero_stage.
//
// Every checkpoint holds the complete HF folder (or PEFT adapter), written by rank 0: under ZeRO
// stages 1 and 2 the weights are never sharded, and under stage 3 every rank takes part in
// gathering them for the save; those files are copied. The training state is re-cut
// (dist/consolidate.h): the ZeRO optimizer shards (optimizer_rank_R.safetensors, pieces
// "<param>@<offset>.<part>") are merged into one optimizer.safetensors of whole "<param>.<part>"
// tensors, every element covered exactly once (else an Error naming the shard and parameter);
// without ZeRO, optimizer.safetensors already holds everything and is copied; the ranks' data
// positions (rank_R.json) become the one-process position of the next global micro-batch no rank
// has taken. leantune_state.json then says world_size 1 and consolidated_from N, and the marker
// completes DIR. Where the training state cannot move to another world size (the online trainers'
// generation state, cp_size > 1, a checkpoint older than the shards' recorded shapes) DIR gets the
// model only, and the command says why. The checkpoint is validated first (complete marker,
// leantune_state.json, every rank's files present for its world size, every safetensors file's
// header, offsets and size as `inspect` checks them, every JSON file parsed); nothing is written
// before the merge has succeeded, and DIR is written whole or not at all (output_path.h
// OutputFolder: never inside the checkpoint, a non-empty DIR only with --overwrite).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/tool_options.h"
#include "dist/consolidate.h"
#include "engine/allocator.h"
#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/option_table.h"
#include "loaders/safetensors.h"
#include "trainers/common/checkpoint.h"
#include "trainers/common/output_path.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

// `state_file`: the checkpoint's resume state (leantune_state.json, or an older checkpoint's
// trainer_state.json); transformers' trainer_state.json beside it is copied like the model.
bool training_state_file(const std::string& name, const std::string& state_file) {
  return name == state_file || name == kCheckpointMarker || name == "optimizer.safetensors" ||
         name.rfind("optimizer_rank_", 0) == 0 ||
         (name.rfind("rank_", 0) == 0 && name.size() > 5 &&
          name.compare(name.size() - 5, 5, ".json") == 0);
}

// The one-process training state of a checkpoint, or the reason it cannot be made.
struct TrainingState {
  std::string why_not;  // "" when the state below is complete
  nlohmann::json trainer_state;
  std::string data_note;
  std::vector<std::pair<std::string, Tensor>> optimizer;  // merged ZeRO shards (else copied)
  std::string optimizer_step;
};

// Every file of the checkpoint, validated as `inspect` validates it: a truncated or corrupt
// weight file is an error naming it, not a copy marked complete.
void validate_checkpoint_files(const std::string& dir) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string path = it->path().string();
    const std::string ext = it->path().extension().string();
    if (ext == ".safetensors") {
      SafetensorsFile::open(path);
    } else if (ext == ".json") {
      read_json_file(path);
    }
  }
  LT_CHECK_INPUT(!ec, dir, ": cannot list: ", ec.message());
  for (const char* model : {"model.safetensors", "model.safetensors.index.json"})
    if (fs::exists(fs::path(dir) / model)) {
      TensorStore::open(dir);
      break;
    }
}

// src (a file or a folder) copied into dst, every file written atomically.
int64_t copy_tree(const fs::path& src, const fs::path& dst) {
  if (!fs::is_directory(src)) {
    copy_file_atomic(src.string(), dst.string());
    return static_cast<int64_t>(fs::file_size(src));
  }
  std::error_code ec;
  fs::create_directory(dst, ec);
  LT_CHECK_INPUT(!ec, dst.string(), ": cannot create folder: ", ec.message());
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(src))
    bytes += copy_tree(e.path(), dst / e.path().filename());
  return bytes;
}

TrainingState merge_training_state(const std::string& dir, const TrainerState& st) {
  TrainingState t;
  if (st.cp_size != 1) {
    t.why_not = "cp_size " + std::to_string(st.cp_size) + " shares data positions over ranks";
    return t;
  }
  std::vector<nlohmann::json> states;
  std::vector<std::string> sources;
  for (int64_t r = 0; r < st.world_size; ++r) {
    if (st.world_size == 1) {
      states.push_back(st.data_state);
      sources.push_back(checkpoint_state_path(dir));
      continue;
    }
    sources.push_back(dir + "/" + rank_state_name(static_cast<int>(r)));
    const nlohmann::json rs = parse_json_strict(read_text_file(sources.back()), sources.back(), 64);
    LT_CHECK_INPUT(rs.is_object() && rs.contains("data_state"), sources.back(),
                   ": expected an object with a 'data_state' object");
    states.push_back(rs["data_state"]);
  }
  MergedDataState data;
  try {
    data = merge_data_states(states, sources);
  } catch (const Error& e) {
    t.why_not = e.what();
    return t;
  }
  if (st.zero_stage > 0 && st.world_size > 1) {
    std::vector<OptimizerShard> shards;
    std::vector<std::pair<std::string, Shape>> shapes;
    for (int64_t r = 0; r < st.world_size; ++r) {
      const std::string path = dir + "/" + rank_optimizer_name(static_cast<int>(r));
      auto f = SafetensorsFile::open(path);
      if (r == 0) {
        if (!f->metadata().count(kParamShapesKey)) {
          t.why_not = path + " does not record the parameters' shapes (written by an older build)";
          return t;
        }
        shapes = parse_param_shapes(f->metadata(), path);
        t.optimizer_step = f->metadata().count("step") ? f->metadata().at("step") : "0";
      }
      const std::string step = f->metadata().count("step") ? f->metadata().at("step") : "0";
      LT_CHECK_INPUT(step == t.optimizer_step, path, ": optimizer step ", step, ", rank 0's is ",
                     t.optimizer_step);
      OptimizerShard shard{path, {}};
      for (const auto& e : f->entries()) shard.tensors.emplace_back(e.name, f->tensor(e));
      shards.push_back(std::move(shard));
    }
    t.optimizer = merge_optimizer_shards(shards, shapes);
  }
  const std::string state_path = checkpoint_state_path(dir);
  t.trainer_state = parse_json_strict(read_text_file(state_path), state_path, 64);
  t.trainer_state["world_size"] = 1;
  t.trainer_state["zero_stage"] = 0;
  t.trainer_state["consolidated_from"] = st.world_size;
  t.trainer_state["data_state"] = data.state;
  t.data_note = data.note;
  return t;
}

struct ConsolidateArguments : OverwriteArguments {
  std::string out;
};

const OptionTable<ConsolidateArguments>& consolidate_table() {
  static const OptionTable<ConsolidateArguments> t =
      OptionTable<ConsolidateArguments>()
          .text("out", &ConsolidateArguments::out,
                "folder for the result (created; must not exist or be empty)")
          .base(overwrite_table());
  return t;
}

int run_consolidate(const std::vector<std::string>& args) {
  Options o("consolidate");
  o.allow_positional("CHECKPOINT", "a checkpoint-N folder of a (data-parallel or ZeRO) run");
  consolidate_table().declare(o);
  if (!o.parse(args)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  LT_CHECK_INPUT(o.positional().size() == 1, "consolidate: expected one CHECKPOINT folder, got ",
                 o.positional().size());
  const ConsolidateArguments a = consolidate_table().read(o);
  const std::string& out = a.out;
  LT_CHECK_INPUT(!out.empty(), "consolidate: option out is required");
  const std::string dir = o.positional()[0];
  LT_CHECK_INPUT(fs::is_directory(dir), "consolidate: ", dir, " is not a folder");
  LT_CHECK_INPUT(fs::exists(dir + "/" + kCheckpointMarker), "consolidate: ", dir,
                 " is not a complete checkpoint (no ", kCheckpointMarker, " marker)");
  const std::string state_path = checkpoint_state_path(dir);
  const TrainerState st = parse_trainer_state(read_text_file(state_path), state_path);
  LT_CHECK_INPUT(!st.save_only_model, "consolidate: ", dir,
                 " was saved with save_only_model: it holds no optimizer state to merge, and its "
                 "model is whole already (use the folder as a model)");
  for (int64_t r = 0; r < st.world_size && st.world_size > 1; ++r) {
    LT_CHECK_INPUT(fs::exists(dir + "/" + rank_state_name(static_cast<int>(r))), dir, ": rank_", r,
                   ".json is missing for a checkpoint of ", st.world_size, " ranks");
    LT_CHECK_INPUT(
        st.zero_stage == 0 || fs::exists(dir + "/" + rank_optimizer_name(static_cast<int>(r))), dir,
        ": optimizer_rank_", r, ".safetensors is missing (zero_stage ", st.zero_stage, ", ",
        st.world_size, " ranks)");
  }
  validate_checkpoint_files(dir);
  const std::vector<CommandInput> inputs = {{dir, "CHECKPOINT"}};
  check_output_folder(out, "out", a.overwrite, inputs);
  const TrainingState train = merge_training_state(dir, st);
  const bool sharded_optimizer = st.zero_stage > 0 && st.world_size > 1;
  if (train.why_not.empty() && !sharded_optimizer)
    LT_CHECK_INPUT(fs::exists(dir + "/optimizer.safetensors"), dir,
                   ": optimizer.safetensors is missing");
  OutputFolder folder(out, "out", a.overwrite, inputs);
  const std::string tmp = folder.dir();
  int64_t files = 0, bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (training_state_file(name, fs::path(state_path).filename().string())) continue;
    bytes += copy_tree(e.path(), fs::path(tmp) / name);
    ++files;
  }
  LT_CHECK_INPUT(files > 0, dir, ": holds no model files");
  auto report = [&] {
    folder.commit();
    std::printf("consolidated %s (%lld rank(s), zero_stage %lld) into %s: %lld model file(s), %s\n",
                dir.c_str(), static_cast<long long>(st.world_size),
                static_cast<long long>(st.zero_stage), out.c_str(), static_cast<long long>(files),
                format_bytes(bytes).c_str());
  };
  if (!train.why_not.empty()) {
    report();
    std::printf("training state left behind (%s is a model folder, not a checkpoint): %s\n",
                out.c_str(), train.why_not.c_str());
    return 0;
  }
  const std::string opt_out = tmp + "/optimizer.safetensors";
  if (sharded_optimizer)
    save_safetensors(opt_out, train.optimizer, {{"step", train.optimizer_step}});
  else
    copy_file_atomic(dir + "/optimizer.safetensors", opt_out);
  write_text_atomic(tmp + "/" + kCheckpointStateFile, train.trainer_state.dump(1));
  write_text_atomic(tmp + "/" + kCheckpointMarker,
                    std::to_string(train.trainer_state.value("global_step", int64_t{0})) + "\n");
  report();
  const nlohmann::json& ds = train.trainer_state["data_state"];
  std::printf(
      "training state: optimizer %s, data at micro-batch %lld of epoch %lld; %s resumes "
      "on any number of ranks and zero_stage\n",
      sharded_optimizer ? ("merged from " + std::to_string(st.world_size) + " shards").c_str()
                        : "copied",
      static_cast<long long>(ds.value("step", ds.value("step_in_epoch", int64_t{0}))),
      static_cast<long long>(ds.value("epoch", int64_t{0})), out.c_str());
  if (!train.data_note.empty()) std::printf("note: %s\n", train.data_note.c_str());
  return 0;
}

}  // namespace

int cmd_consolidate(const std::vector<std::string>& args) { return run_consolidate(args); }

}  // namespace leantune
