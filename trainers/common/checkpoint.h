// Checkpoints in output_dir/checkpoint-N.
//
// A checkpoint folder holds the model as an HF folder (config.json, model.safetensors,
// tokenizer files), optimizer.safetensors (AdamW state), leantune_state.json (step, epoch, data
// position, random streams' offsets (LoRA dropout), counters, options, best evaluation): the
// state after the checkpoint's last completed update, from which a resumed run continues bit for
// bit; and trainer_state.json in transformers' TrainerState schema (log_history, best_metric,
// global_step, ...), which transformers' TrainerState.load_from_json reads. It is written into a
// hidden temporary folder, every file fsynced, then renamed into place; the last file written
// inside it before the rename is the marker `checkpoint_complete`. A folder
// without the marker is ignored (a save killed half-way leaves the previous checkpoint as
// `latest`). A save that fails (a full disk) removes its own temporary folder; the temporary
// folders of killed saves are removed when the next run starts (clean_stale_checkpoint_files), so a
// nearly full disk does not stay full of them.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainers/common/evaluation.h"

namespace leantune {

constexpr const char* kCheckpointMarker = "checkpoint_complete";
constexpr const char* kCheckpointStateFile = "leantune_state.json";

// A data-parallel checkpoint's per-rank files: the data position (rank_R.json) and, under ZeRO,
// the optimizer shard (optimizer_rank_R.safetensors).
std::string rank_state_name(int rank);
std::string rank_optimizer_name(int rank);

// Writes output_dir/checkpoint-<step>: `fill(tmp_dir)` writes the files into the temporary
// folder; then the marker, fsyncs and the rename. An existing folder of the same name is
// replaced only after the new one is complete.
std::string write_checkpoint(const std::string& output_dir, int64_t step,
                             const std::function<void(const std::string& dir)>& fill);

// Complete checkpoints (with the marker), sorted by step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& output_dir);
// "latest" -> newest complete checkpoint in output_dir (Error if none); a path -> that folder
// (Error if it is not a complete checkpoint).
std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir);
// Deletes the oldest complete checkpoints beyond `limit` (0 = keep all), never `keep` (the best
// model's checkpoint, "" = none) nor the newest, and stale temporary folders left by killed saves.
void rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& keep = "");

struct StaleCleanup {
  int64_t removed = 0;   // temporary folders deleted
  int64_t bytes = 0;     // what they held
  int64_t restored = 0;  // checkpoints moved back from a replaced (".old-") folder
};
// Removes the `.checkpoint-N.tmp-*` folders of saves that were killed or failed. A
// `.checkpoint-N.old-*` folder is the complete previous checkpoint-N of a save killed between
// its two renames: it is moved back when checkpoint-N is missing, removed otherwise.
StaleCleanup clean_stale_checkpoint_files(const std::string& output_dir);

// leantune_state.json of a checkpoint, validated.
struct TrainerState {
  int64_t global_step = 0;
  int64_t optimizer_step = 0;
  int64_t num_tokens = 0;
  int64_t consecutive_nonfinite = 0;
  int64_t skipped_steps = 0;
  std::string optim = "adamw_torch";       // the --optim whose state the checkpoint holds
  std::string offload_optimizer = "none";  // and its --offload_optimizer
  nlohmann::json data_state;               // an object, read by the trainer's data side
  int64_t world_size = 1;                  // ranks of the run that wrote it (data parallel / ZeRO)
  int64_t zero_stage = 0;
  int64_t cp_size = 1;
  // world_size 1: the one-process form (optimizer.safetensors with whole tensors, one data
  // state), which resumes on any number of ranks and any zero_stage; consolidated_from: the ranks
  // of the run that `trainer_bin consolidate` merged it from (0: written by one process).
  int64_t consolidated_from = 0;
  // The random streams' offsets at the checkpoint's step ({"lora_dropout": blocks} under LoRA);
  // empty in checkpoints older than them.
  nlohmann::json rng = nlohmann::json::object();
  // Written with --save_only_model: the model alone, which no run resumes from.
  bool save_only_model = false;
  BestModel best;  // the best evaluation up to the checkpoint (none in older checkpoints)
  nlohmann::json lr_scheduler;  // reduce_lr_on_plateau's state (LrScheduler::set_state checks it)
};
// The resume state of checkpoint `dir`: its leantune_state.json, or the trainer_state.json of a
// checkpoint written before the two were separate.
std::string checkpoint_state_path(const std::string& dir);
// The log_history of checkpoint `dir`'s trainer_state.json (empty for an older checkpoint,
// whose trainer_state.json is its resume state); Error(kInput) naming the file when malformed.
nlohmann::json read_log_history(const std::string& dir);
// Parses the text of trainer_state.json. Error(kInput) naming `source` and the key for invalid
// JSON, a missing key, or a value that is not a non-negative integer (data_state: an object;
// optim, offload_optimizer: strings, absent in checkpoints older than them).
TrainerState parse_trainer_state(std::string_view text, const std::string& source);
// The 'rng' object of trainer_state.json or of a rank's file: Error(kInput) naming `source` unless
// it is an object of non-negative integers.
nlohmann::json parse_rng_state(const nlohmann::json& rng, const std::string& source);

}  // namespace leantune
