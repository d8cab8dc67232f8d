// YAML config files (`--config sft.yaml`, as TRL's CLI takes them) read into the JSON object the
// options apply (loaders/options.h), through libyaml's parser.
//
// One document; mappings become objects, sequences arrays. A plain (unquoted) scalar is typed by
// YAML 1.2's core schema: null (~, null, empty), true/false (any case), integers (decimal, 0x, 0o),
// floats (1.5, 2e-5, .inf, .nan); anything else, and every quoted or block scalar, is a string.
// Refused, each an Error(kInput) naming the file, line and column: a syntax error, a duplicate
// key, a key that is not a string, an alias or anchor (a config needs none), several documents,
// nesting deeper than 64 levels.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace leantune {

nlohmann::json parse_yaml_config(std::string_view text, const std::string& source);

// Whether a config path names a YAML file (.yaml or .yml).
bool is_yaml_path(const std::string& path);

}  // namespace leantune
