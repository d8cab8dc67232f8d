// Data option parsing, validation and resolution (see data_config.h for the rules).
#include "loaders/data_config.h"

#include <charconv>

#include "engine/check.h"

namespace leantune {

TruncationMode parse_truncation_mode(std::string_view name) {
  if (name == "keep_start") return TruncationMode::kKeepStart;
  if (name == "keep_end") return TruncationMode::kKeepEnd;
  LT_THROW(ErrorKind::kInput, "truncation_mode: unknown value '", name,
           "' (expected keep_start or keep_end)");
}

const char* truncation_mode_name(TruncationMode m) {
  return m == TruncationMode::kKeepStart ? "keep_start" : "keep_end";
}

int64_t parse_max_length(std::string_view text) {
  if (text == "none" || text == "None" || text == "null") return 0;
  int64_t v = -1;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  LT_CHECK_INPUT(ec == std::errc() && ptr == text.data() + text.size() && v >= 0,
                 "max_length: expected a non-negative integer or 'none', got '", text, "'");
  return v;
}

void validate_data_config(const DataConfig& cfg) {
  LT_CHECK_INPUT(!cfg.dataset_text_field.empty(), "dataset_text_field must not be empty");
  LT_CHECK_INPUT(cfg.max_length >= 0, "max_length must be >= 0 (0 = none), got ", cfg.max_length);
  parse_truncation_mode(cfg.truncation_mode);
  parse_packing_strategy(cfg.packing_strategy);
  LT_CHECK_INPUT(cfg.max_prompt_length >= 0, "max_prompt_length must be >= 0 (0 = none), got ",
                 cfg.max_prompt_length);
  LT_CHECK_INPUT(cfg.max_completion_length >= 0,
                 "max_completion_length must be >= 0 (0 = none), got ", cfg.max_completion_length);
  LT_CHECK_INPUT(!cfg.packing || cfg.max_length > 0,
                 "packing=true needs max_length > 0 (it is the bin size)");
  LT_CHECK_INPUT(cfg.packing_window >= 0, "packing_window must be >= 0, got ", cfg.packing_window);
  LT_CHECK_INPUT(cfg.pad_to_multiple_of >= 0, "pad_to_multiple_of must be >= 0, got ",
                 cfg.pad_to_multiple_of);
  LT_CHECK_INPUT(cfg.per_device_train_batch_size >= 1,
                 "per_device_train_batch_size must be >= 1, got ", cfg.per_device_train_batch_size);
}

bool resolve_padding_free(const DataConfig& cfg) {
  const bool bfd_packing =
      cfg.packing && parse_packing_strategy(cfg.packing_strategy) != PackingStrategy::kWrapped;
  return cfg.padding_free.value_or(false) || bfd_packing;
}

bool resolve_completion_only_loss(const DataConfig& cfg, const DatasetFormat& format) {
  if (cfg.completion_only_loss.has_value()) return *cfg.completion_only_loss;
  return format.kind == DatasetKind::kPromptCompletion ||
         (format.kind == DatasetKind::kTokenized && format.has_completion_mask);
}

}  // namespace leantune
