// Fuzz target for the option parser's config path: arbitrary bytes are a --config file's text,
// parsed (parse_config_json: duplicate keys, depth) and applied to an option set with one option
// of every type, ranges and choices (Options::apply_config_text). A rejection must be an Error
// of kind kInput; a crash, a sanitizer report, another exception or an internal Error aborts.
// An accepted config must read back within each option's range.
// Builds: fuzz_options_corpus (ctest, over tests/fuzz/corpus/options) and, with clang and
// LEANTUNE_FUZZ=ON, the libFuzzer target fuzz_options (see tests/fuzz/fuzz.cmake).
#include <cstdlib>
#include <string_view>

#include "engine/check.h"
#include "loaders/options.h"
#include "tests/fuzz/fuzz_corpus_main.h"

bool fuzz_accepts(const uint8_t* data, size_t size) {
  leantune::Options o("fuzz");
  o.add_bool("packing", false, "b");
  o.add_bool_or_none("padding_free", std::nullopt, "bn");
  o.add_int("max_steps", -1, "i");
  o.add_int("per_device_train_batch_size", 8, "i", 1);
  o.add_int("lora_r", 8, "i", 1, 4096);
  o.add_int_or_none("max_length", 1024, "in", 1);
  o.add_float("learning_rate", 2e-5, "f", 0.0);
  o.add_float("warmup_ratio", 0.0, "f", 0.0, 1.0);
  o.add_string("output_dir", "out", "s");
  o.add_string("packing_strategy", "bfd", "s", {"bfd", "bfd_split", "wrapped"});
  o.add_string_list("lora_target_modules", {}, "l");
  try {
    o.apply_config_text(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const leantune::Error& e) {
    if (e.kind() != leantune::ErrorKind::kInput) {
      std::fprintf(stderr, "internal error on fuzz input: %s\n", e.what());
      std::abort();
    }
    return false;
  }
  if (o.get_int("per_device_train_batch_size") < 1) std::abort();
  const int64_t r = o.get_int("lora_r");
  if (r < 1 || r > 4096) std::abort();
  const double w = o.get_float("warmup_ratio");
  if (!(w >= 0.0 && w <= 1.0)) std::abort();
  if (auto ml = o.get_int_or_none("max_length"); ml && *ml < 1) std::abort();
  (void)o.get_string_list("lora_target_modules");
  (void)o.to_json().dump();
  return true;
}
