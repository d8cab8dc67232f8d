// Checkpoints in output_dir/checkpoint-N.
//
// A checkpoint folder holds the model as an HF folder (config.json, model.safetensors,
// tokenizer files), optimizer.safetensors (AdamW state), and trainer_state.json (step, epoch,
// data position, RNG offsets, counters, options, log history). It is written into a hidden
// temporary folder, every file fsynced, then renamed into place; the last file written inside
// it before the rename is the marker `checkpoint_complete`. A folder without the marker is
// ignored (a save killed half-way leaves the previous checkpoint as `latest`).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace leantune {

constexpr const char* kCheckpointMarker = "checkpoint_complete";

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
// Deletes the oldest complete checkpoints beyond `limit` (0 = keep all), and stale temporary
// folders left by killed saves.
void rotate_checkpoints(const std::string& output_dir, int64_t limit);

}  // namespace leantune
