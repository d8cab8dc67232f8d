// Fuzz target for YAML config files (--config F.yaml): arbitrary bytes are the file's text, read
// by parse_yaml_config (loaders/yaml_config.h: libyaml's parser, core-schema scalars, duplicate
// keys, aliases, depth) and applied to an option set with one option of every type. A rejection
// must be an Error of kind kInput; a crash, a sanitizer report, another exception or an internal
// Error aborts. An accepted config must read back within each option's range.
// Builds: fuzz_yaml_config_corpus (ctest, over tests/fuzz/corpus/yaml_config) and, with clang
// and LEANTUNE_FUZZ=ON, the libFuzzer target fuzz_yaml_config (see tests/fuzz/fuzz.cmake).
#include <cstdlib>
#include <string_view>

#include "engine/check.h"
#include "loaders/options.h"
#include "loaders/yaml_config.h"
#include "tests/fuzz/fuzz_corpus_main.h"

bool fuzz_accepts(const uint8_t* data, size_t size) {
  leantune::Options o("fuzz");
  o.add_bool("packing", false, "b");
  o.add_int("max_steps", -1, "i");
  o.add_int("lora_r", 8, "i", 1, 4096);
  o.add_int_or_none("max_length", 1024, "in", 1);
  o.add_float("learning_rate", 2e-5, "f", 0.0);
  o.add_string("packing_strategy", "bfd", "s", {"bfd", "bfd_split", "wrapped"});
  o.add_string_list("lora_target_modules", {}, "l");
  try {
    o.apply_json(leantune::parse_yaml_config(
                     std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.yaml"),
                 "fuzz.yaml");
  } catch (const leantune::Error& e) {
    if (e.kind() != leantune::ErrorKind::kInput) {
      std::fprintf(stderr, "internal error on fuzz input: %s\n", e.what());
      std::abort();
    }
    return false;
  }
  const int64_t r = o.get_int("lora_r");
  if (r < 1 || r > 4096) std::abort();
  if (auto ml = o.get_int_or_none("max_length"); ml && *ml < 1) std::abort();
  if (!(o.get_float("learning_rate") >= 0.0)) std::abort();
  (void)o.get_string_list("lora_target_modules");
  (void)o.to_json().dump();
  return true;
}
