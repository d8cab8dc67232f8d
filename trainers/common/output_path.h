// Checks of the paths a command writes to, made before any work so that a bad --output_dir or
// --out is exit 2 naming the option (not a filesystem exception from deep inside a save), and
// the one way tool commands write their outputs.
//
// The rules every command follows:
//   - an output is never one of the command's inputs, never lies inside an input folder, and an
//     output folder never holds an input (check_output_not_input; symlinks and hard links are
//     resolved, so a link to an input is that input);
//   - a tool command (init-model --out, consolidate --out) refuses a non-empty output folder
//     unless --overwrite (overwrite_table), and writes the folder whole or not at all
//     (OutputFolder);
//   - every output file is written to a temporary name in its own folder and renamed on success,
//     removed on failure (loaders/fs_util.h write_file_atomic), and a failed write is an error
//     naming the file and the reason ("No space left on device", "File too large").
// Training's --output_dir is not a tool output: it holds the checkpoints that
// resume_from_checkpoint reads, so it may be non-empty (prepare_output_dir).
#pragma once

#include <string>
#include <vector>

#include "loaders/option_table.h"

namespace leantune {

// An input a command reads: its path and how the command line names it ("--dataset",
// "CHECKPOINT"). An empty path is no input.
struct CommandInput {
  std::string path;
  std::string name;
};

// Creates the folder `path` (with its parents) and checks that a file can be created in it.
// Error(kInput) "option --<option>: ..." when a component is a file, the folder cannot be
// created, or it is not writable.
void prepare_output_dir(const std::string& path, const std::string& option);

// For an output file: it must not be a folder, nor one of `inputs` or inside an input folder,
// and its folder must exist and be writable.
void check_output_file(const std::string& path, const std::string& option,
                       const std::vector<CommandInput>& inputs = {});

// Error(kInput) "option --<option>: ..." naming the input when `out` is an input, lies inside an
// input folder, or holds an input.
void check_output_not_input(const std::string& out, const std::string& option,
                            const std::vector<CommandInput>& inputs);

// Declares --overwrite (a tool command whose output is a folder).
struct OverwriteArguments {
  bool overwrite = false;
};
const OptionTable<OverwriteArguments>& overwrite_table();

// A tool command's output folder, checked before any work: not a file, not an input (above), and
// absent or empty unless `overwrite`.
void check_output_folder(const std::string& path, const std::string& option, bool overwrite,
                         const std::vector<CommandInput>& inputs);

// A tool command's output folder, written whole or not at all. The constructor checks the path
// (check_output_folder) and creates a temporary folder beside it (".<name>.tmp-<pid>", on the
// same file system); the command writes into dir(); commit() fsyncs it and renames it into place,
// replacing an existing folder (--overwrite) only then. A folder that is not committed (the
// command failed) is removed with what it holds.
class OutputFolder {
 public:
  OutputFolder(std::string path, std::string option, bool overwrite,
               const std::vector<CommandInput>& inputs);
  ~OutputFolder();
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

  // Where the files go until commit().
  const std::string& dir() const { return tmp_; }
  void commit();

 private:
  std::string path_, option_, tmp_;
  bool committed_ = false;
};

}  // namespace leantune
