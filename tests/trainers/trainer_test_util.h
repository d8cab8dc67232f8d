// Helpers for trainer tests: a tiny model folder (random init + the embedded tokenizer), the
// small story dataset, and running trainer_bin in a fresh process.
#pragma once

#include <string>
#include <vector>

#include "loaders/options.h"

namespace leantune::testing {

// Writes a tiny Qwen2 model (tests/fixtures/trainer/tiny_config.json, seed 1) with the
// embedded tokenizer into `dir` and returns dir.
std::string make_tiny_model(const std::string& dir, uint64_t seed = 1);
std::string small_dataset();
// The sft options of a short CPU run of `model` on the small dataset into `out`: max_length 64,
// a log line every step, no checkpoints, learning rate 1e-3, seed 3; then the `extra` flags
// (a later flag overrides an earlier one).
Options tiny_sft_options(const std::string& model, const std::string& out,
                         const std::vector<std::string>& extra = {});
std::string trainer_bin();
// Runs a command; returns its exit status (-1 if it did not exit normally). stderr/stdout of
// the child are captured into *out when given.
int run_command(const std::string& cmd, std::string* out = nullptr);
// The "loss" values of metrics.jsonl records, by step.
std::vector<std::pair<int64_t, double>> read_losses(const std::string& metrics_jsonl);
std::string read_file(const std::string& path);

}  // namespace leantune::testing
