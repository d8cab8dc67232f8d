// Output-path checks and the tool commands' output folder (output_path.h). Writability is tested
// by creating and removing a probe file: the one test that covers permissions, read-only mounts
// and root alike.
#include "trainers/common/output_path.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/options.h"

namespace leantune {

namespace fs = std::filesystem;

namespace {
void check_writable(const fs::path& dir, const std::string& path, const std::string& option) {
  const fs::path probe = dir / (".leantune-write-probe-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  LT_CHECK_INPUT(fd >= 0, "option --", option, ": cannot write into folder '", dir.string(),
                 "' (for '", path, "'): ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

// The first existing path among `p` and its ancestors; Error when it is not a folder.
void check_no_file_in_the_way(const fs::path& p, const std::string& path,
                              const std::string& option) {
  std::error_code ec;
  for (fs::path q = p; !q.empty(); q = q.parent_path()) {
    const fs::file_status st = fs::status(q, ec);
    if (fs::exists(st)) {
      LT_CHECK_INPUT(fs::is_directory(st), "option --", option, ": '", path,
                     q == p ? "' exists and is not a folder"
                            : "' cannot be created: '" + q.string() + "' is a file");
      return;
    }
    if (q == q.parent_path()) return;
  }
}

// `p` absolute, with every existing component's symlinks resolved and no trailing separator.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) r = fs::absolute(p).lexically_normal();
  if (r.filename().empty() && r.has_parent_path()) r = r.parent_path();
  return r;
}

// Whether `a` is `dir` or lies inside it (both resolved).
bool within(const fs::path& a, const fs::path& dir) {
  auto d = dir.begin();
  for (auto i = a.begin(); d != dir.end(); ++i, ++d)
    if (i == a.end() || *i != *d) return false;
  return true;
}

// The same file or folder: one path, or (both existing) one inode through another link.
bool same_file(const fs::path& a, const fs::path& b) {
  if (a == b) return true;
  std::error_code ec;
  return fs::equivalent(a, b, ec) && !ec;
}

// path -> ".<name>.<tag>-<pid>" beside it.
fs::path sibling(const fs::path& path, const char* tag) {
  return path.parent_path() /
         ("." + path.filename().string() + "." + tag + "-" + std::to_string(::getpid()));
}
}  // namespace

void prepare_output_dir(const std::string& path, const std::string& option) {
  LT_CHECK_INPUT(!path.empty(), "option --", option, " must not be empty");
  const fs::path p(path);
  check_no_file_in_the_way(p, path, option);
  std::error_code ec;
  fs::create_directories(p, ec);
  LT_CHECK_INPUT(!ec, "option --", option, ": cannot create folder '", path, "': ", ec.message());
  check_writable(p, path, option);
}

void check_output_not_input(const std::string& out, const std::string& option,
                            const std::vector<CommandInput>& inputs) {
  const fs::path o = resolved(out);
  for (const CommandInput& in : inputs) {
    if (in.path.empty()) continue;
    const fs::path i = resolved(in.path);
    const char* how = same_file(o, i) ? "is"
                      : within(o, i)  ? "lies inside"
                      : within(i, o)  ? "holds"
                                      : nullptr;
    LT_CHECK_INPUT(how == nullptr, "option --", option, ": '", out, "' ", how, " the input ",
                   in.name, " '", in.path, "'; write the output outside the inputs");
  }
}

void check_output_file(const std::string& path, const std::string& option,
                       const std::vector<CommandInput>& inputs) {
  LT_CHECK_INPUT(!path.empty() && path.back() != '/', "option --", option, ": '", path,
                 "' is not a file path");
  const fs::path p(path);
  std::error_code ec;
  LT_CHECK_INPUT(!fs::is_directory(p, ec), "option --", option, ": '", path, "' is a folder");
  check_output_not_input(path, option, inputs);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  check_no_file_in_the_way(dir, dir.string(), option);
  LT_CHECK_INPUT(fs::is_directory(dir, ec), "option --", option, ": folder '", dir.string(),
                 "' of '", path, "' does not exist");
  check_writable(dir, path, option);
}

const OptionTable<OverwriteArguments>& overwrite_table() {
  static const OptionTable<OverwriteArguments> t = OptionTable<OverwriteArguments>().flag(
      "overwrite", &OverwriteArguments::overwrite,
      "replace an existing non-empty output folder (it is replaced only once the new one is "
      "complete)");
  return t;
}

void check_output_folder(const std::string& path, const std::string& option, bool overwrite,
                         const std::vector<CommandInput>& inputs) {
  LT_CHECK_INPUT(!path.empty(), "option --", option, " must not be empty");
  check_no_file_in_the_way(fs::path(path), path, option);
  check_output_not_input(path, option, inputs);
  std::error_code ec;
  LT_CHECK_INPUT(overwrite || !fs::is_directory(path, ec) || fs::is_empty(path, ec), "option --",
                 option, ": '", path,
                 "' is a folder that is not empty (pass --overwrite to replace it)");
}

OutputFolder::OutputFolder(std::string path, std::string option, bool overwrite,
                           const std::vector<CommandInput>& inputs)
    : path_(std::move(path)), option_(std::move(option)) {
  check_output_folder(path_, option_, overwrite, inputs);
  const fs::path p = resolved(path_);
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  LT_CHECK_INPUT(!ec, "option --", option_, ": cannot create folder '", p.parent_path().string(),
                 "': ", ec.message());
  tmp_ = sibling(p, "tmp").string();
  fs::remove_all(tmp_, ec);
  LT_CHECK_INPUT(fs::create_directory(tmp_, ec) && !ec, "option --", option_,
                 ": cannot create folder '", tmp_, "': ", ec ? ec.message() : "it exists");
}

OutputFolder::~OutputFolder() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void OutputFolder::commit() {
  LT_CHECK(!committed_, "OutputFolder: committed twice");
  const fs::path p = resolved(path_);
  fsync_dir(tmp_);
  std::error_code ec;
  fs::path old;
  if (fs::is_directory(p, ec) && !fs::is_empty(p, ec)) {
    // --overwrite: the old folder steps aside, the new one takes its name, then the old goes.
    old = sibling(p, "old");
    fs::remove_all(old, ec);
    fs::rename(p, old, ec);
    LT_CHECK_INPUT(!ec, "option --", option_, ": cannot move '", path_,
                   "' aside to replace it: ", ec.message());
  }
  fs::rename(tmp_, p, ec);
  if (ec) {
    std::error_code back;
    if (!old.empty()) fs::rename(old, p, back);
    LT_THROW(ErrorKind::kInput, "option --", option_, ": cannot move '", tmp_, "' to '", path_,
             "': ", ec.message());
  }
  committed_ = true;
  if (!old.empty()) fs::remove_all(old, ec);
  fsync_dir(p.parent_path().string());
}

}  // namespace leantune
