// Data options of the trainers, with TRL's names and defaults, and how they resolve.
//
// Contract: DataConfig is plain data; validate_data_config() throws Error(kInput) naming the
// option for any bad value. Resolution rules (TRL's):
//   padding_free         unset -> on iff packing with bfd/bfd_split; packing with bfd/bfd_split
//                        forces it on even when set false (TRL: padding_free or bfd-packing).
//                        Without packing it is allowed with max_length set (TRL raises there
//                        because its collator would not truncate; here truncation happens when
//                        the examples are loaded, so max_length is always enforced).
//   completion_only_loss unset -> on for prompt_completion data and for tokenized data that
//                        carries a completion_mask.
//   max_length           0 = none (no truncation; packing requires max_length > 0).
//   truncation_mode      keep_start | keep_end, for SFT truncation and for the final max_length
//                        cut of preference sequences (TRL's older DPO semantics).
//   max_prompt_length    preference/unpaired: the prompt keeps its LAST tokens (0 = none).
//   max_completion_length preference/unpaired: completions keep their FIRST tokens (0 = none).
//
// API
//   DataConfig cfg; cfg.max_length = 2048; ...; validate_data_config(cfg);
//   int64_t parse_max_length("none" | "0" | "2048")
//   TruncationMode parse_truncation_mode("keep_start")
//   bool resolve_padding_free(cfg); bool resolve_completion_only_loss(cfg, format)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "loaders/dataset.h"
#include "loaders/pack.h"

namespace leantune {

enum class TruncationMode { kKeepStart, kKeepEnd };
TruncationMode parse_truncation_mode(std::string_view name);
const char* truncation_mode_name(TruncationMode m);

struct DataConfig {
  // dataset
  std::string dataset_text_field = "text";
  bool skip_bad_lines = false;
  // truncation
  int64_t max_length = 1024;  // 0 = none
  std::string truncation_mode = "keep_start";
  int64_t max_prompt_length = 512;    // preference data; 0 = none
  int64_t max_completion_length = 0;  // preference data; 0 = none
  // loss masks
  std::optional<bool> completion_only_loss;
  bool assistant_only_loss = false;
  // packing and collation
  bool packing = false;
  std::string packing_strategy = "bfd";
  int64_t packing_window = 0;  // 0 = whole dataset; 1000 reproduces TRL's per-map-batch packing
  std::optional<bool> padding_free;
  int64_t pad_to_multiple_of = 0;  // 0 = none
  // order
  int64_t per_device_train_batch_size = 8;
  uint64_t seed = 42;
  bool shuffle = true;  // per-epoch shuffling of examples / packed bins (HF Trainer's sampler)
};

int64_t parse_max_length(std::string_view text);
void validate_data_config(const DataConfig& cfg);
bool resolve_padding_free(const DataConfig& cfg);
bool resolve_completion_only_loss(const DataConfig& cfg, const DatasetFormat& format);

}  // namespace leantune
