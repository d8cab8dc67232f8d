// Checks of the paths a command writes to, made before any work so that a bad --output_dir or
// --out is exit 2 naming the option (not a filesystem exception from deep inside a save).
#pragma once

#include <string>

namespace leantune {

// Creates the folder `path` (with its parents) and checks that a file can be created in it.
// Error(kInput) "option --<option>: ..." when a component is a file, the folder cannot be
// created, or it is not writable.
void prepare_output_dir(const std::string& path, const std::string& option);

// For an output file: it must not be a folder, and its folder must exist and be writable.
void check_output_file(const std::string& path, const std::string& option);

}  // namespace leantune
