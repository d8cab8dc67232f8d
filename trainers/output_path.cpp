// Output-path checks (output_path.h). Writability is tested by creating and removing a probe
// file: the one test that covers permissions, read-only mounts and root alike.
#include "trainers/output_path.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/check.h"

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

void check_output_file(const std::string& path, const std::string& option) {
  LT_CHECK_INPUT(!path.empty() && path.back() != '/', "option --", option, ": '", path,
                 "' is not a file path");
  const fs::path p(path);
  std::error_code ec;
  LT_CHECK_INPUT(!fs::is_directory(p, ec), "option --", option, ": '", path, "' is a folder");
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  check_no_file_in_the_way(dir, dir.string(), option);
  LT_CHECK_INPUT(fs::is_directory(dir, ec), "option --", option, ": folder '", dir.string(),
                 "' of '", path, "' does not exist");
  check_writable(dir, path, option);
}

}  // namespace leantune
