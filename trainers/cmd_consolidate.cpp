// `trainer_bin consolidate CHECKPOINT --out DIR`: the model of a data-parallel or ZeRO checkpoint
// as a plain folder, ready for transformers/PEFT or for a new run (with a fresh optimizer) on any
// number of ranks.
//
// Every checkpoint holds the complete HF folder (or PEFT adapter), written by rank 0: under ZeRO
// stages 1 and 2 the weights are never sharded, and under stage 3 every rank takes part in
// gathering them for the save. The shards are only the optimizer's states
// (optimizer_rank_R.safetensors) and data positions (rank_R.json); they are not re-cut for
// another world size. Consolidating therefore
// copies the model's files (config, weights, adapter, tokenizer) and leaves the training state
// behind. The checkpoint is validated first (complete marker, trainer_state.json, every rank's
// files present for its world size).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "loaders/fs_util.h"
#include "trainers/checkpoint.h"
#include "trainers/commands.h"
#include "trainers/options.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

bool training_state_file(const std::string& name) {
  return name == "trainer_state.json" || name == kCheckpointMarker ||
         name == "optimizer.safetensors" || name.rfind("optimizer_rank_", 0) == 0 ||
         (name.rfind("rank_", 0) == 0 && name.size() > 5 &&
          name.compare(name.size() - 5, 5, ".json") == 0);
}

int run_consolidate(const std::vector<std::string>& args) {
  Options o("consolidate");
  o.allow_positional("CHECKPOINT", "a checkpoint-N folder of a (data-parallel or ZeRO) run");
  o.add_string("out", "", "folder for the model (created; must not exist or be empty)");
  if (!o.parse(args)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  LT_CHECK_INPUT(o.positional().size() == 1, "consolidate: expected one CHECKPOINT folder, got ",
                 o.positional().size());
  const std::string out = o.get_string("out");
  LT_CHECK_INPUT(!out.empty(), "consolidate: option out is required");
  const std::string dir = o.positional()[0];
  LT_CHECK_INPUT(fs::is_directory(dir), "consolidate: ", dir, " is not a folder");
  LT_CHECK_INPUT(fs::exists(dir + "/" + kCheckpointMarker), "consolidate: ", dir,
                 " is not a complete checkpoint (no ", kCheckpointMarker, " marker)");
  const std::string state_path = dir + "/trainer_state.json";
  const TrainerState st = parse_trainer_state(read_text_file(state_path), state_path);
  for (int64_t r = 1; r < st.world_size; ++r) {
    LT_CHECK_INPUT(fs::exists(dir + "/rank_" + std::to_string(r) + ".json"), dir, ": rank_", r,
                   ".json is missing for a checkpoint of ", st.world_size, " ranks");
    LT_CHECK_INPUT(st.zero_stage == 0 ||
                       fs::exists(dir + "/optimizer_rank_" + std::to_string(r) + ".safetensors"),
                   dir, ": optimizer_rank_", r, ".safetensors is missing (zero_stage ",
                   st.zero_stage, ", ", st.world_size, " ranks)");
  }
  LT_CHECK_INPUT(!fs::exists(out) || (fs::is_directory(out) && fs::is_empty(out)), out,
                 ": exists and is not an empty folder");
  fs::create_directories(out);
  int64_t files = 0, bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (training_state_file(name)) continue;
    fs::copy(e.path(), fs::path(out) / name, fs::copy_options::recursive);
    ++files;
    if (e.is_regular_file()) bytes += static_cast<int64_t>(e.file_size());
  }
  LT_CHECK_INPUT(files > 0, dir, ": holds no model files");
  std::printf("consolidated %s (%lld rank(s), zero_stage %lld) into %s: %lld file(s), %s\n",
              dir.c_str(), static_cast<long long>(st.world_size),
              static_cast<long long>(st.zero_stage), out.c_str(), static_cast<long long>(files),
              format_bytes(bytes).c_str());
  return 0;
}

CommandRegistration reg("consolidate",
                        "the model of a data-parallel or ZeRO checkpoint as a plain folder",
                        run_consolidate);

}  // namespace
}  // namespace leantune
