// Files that travel with a model folder.
#pragma once

#include <string>

namespace leantune {

// Copies tokenizer.json, tokenizer_config.json, special_tokens_map.json, and the vocab/merges
// files and chat template files when present, from `src` to `dst`. Returns how many were
// copied; a src folder without tokenizer.json is an Error.
int copy_tokenizer_files(const std::string& src, const std::string& dst);

}  // namespace leantune
