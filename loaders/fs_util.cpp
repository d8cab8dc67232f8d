// Atomic writes: temp file in the same directory -> fflush -> fsync -> rename -> fsync(dir).
// See fs_util.h for the contract.
#include "loaders/fs_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include "engine/check.h"

namespace leantune {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Opens a new, exclusive temporary file beside `path`. The name is unique per process and call,
// so concurrent writers of the same destination never share a temp file.
int open_temp(const std::string& path, std::string* temp_path) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    *temp_path =
        path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    const int fd = ::open(temp_path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    if (errno != EEXIST) {
      LT_THROW(ErrorKind::kInput, path, ": cannot create temporary file '", *temp_path,
               "': ", errno_text(errno));
    }
  }
  LT_THROW(ErrorKind::kInput, path, ": cannot find a free temporary file name");
}

}  // namespace

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  LT_CHECK_INPUT(fd >= 0, dir, ": cannot open directory to sync it: ", errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems do not support fsync on directories; there is nothing more to make
  // durable on them, so only real I/O errors count.
  LT_CHECK_INPUT(rc == 0 || err == EINVAL || err == ENOTSUP, dir,
                 ": fsync of directory failed: ", errno_text(err));
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  LT_CHECK_INPUT(!path.empty() && path.back() != '/', "cannot write to '", path,
                 "': not a file path");
  std::string temp;
  const int fd = open_temp(path, &temp);
  std::FILE* f = ::fdopen(fd, "wb");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    LT_THROW(ErrorKind::kInput, path, ": cannot open temporary file: ", errno_text(err));
  }
  try {
    write(f);
    LT_CHECK_INPUT(std::fflush(f) == 0, path, ": write failed: ", errno_text(errno));
    LT_CHECK_INPUT(!std::ferror(f), path, ": write failed");
    LT_CHECK_INPUT(::fsync(::fileno(f)) == 0, path, ": fsync failed: ", errno_text(errno));
  } catch (...) {
    std::fclose(f);
    ::unlink(temp.c_str());
    throw;
  }
  if (std::fclose(f) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    LT_THROW(ErrorKind::kInput, path, ": close failed: ", errno_text(err));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    LT_THROW(ErrorKind::kInput, path,
             ": cannot rename temporary file into place: ", errno_text(err));
  }
  fsync_dir(parent_dir(path));
}

void write_bytes(std::FILE* f, const void* data, size_t size, const std::string& path) {
  if (size == 0) return;
  errno = 0;
  if (std::fwrite(data, 1, size, f) != size) {
    LT_THROW(ErrorKind::kInput, path,
             ": write failed: ", errno != 0 ? errno_text(errno) : std::string("short write"));
  }
}

void write_text_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size(), path); });
}

void copy_file_atomic(const std::string& src, const std::string& dst) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(src.c_str(), "rb"), std::fclose);
  LT_CHECK_INPUT(in != nullptr, src, ": cannot read: ", errno_text(errno));
  write_file_atomic(dst, [&](std::FILE* out) {
    std::vector<char> buf(size_t{1} << 20);
    for (;;) {
      const size_t n = std::fread(buf.data(), 1, buf.size(), in.get());
      LT_CHECK_INPUT(!std::ferror(in.get()), src, ": read failed: ", errno_text(errno));
      write_bytes(out, buf.data(), n, dst);
      if (n < buf.size()) return;
    }
  });
}

std::string read_text_file(const std::string& path) {
  struct stat st {};
  LT_CHECK_INPUT(::stat(path.c_str(), &st) == 0, path, ": cannot read: ", errno_text(errno));
  LT_CHECK_INPUT(!S_ISDIR(st.st_mode), path, ": cannot read: is a directory");
  std::ifstream in(path, std::ios::binary);
  LT_CHECK_INPUT(in.good(), path, ": cannot open: ", errno_text(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  LT_CHECK_INPUT(!in.bad(), path, ": read failed: ", errno_text(errno));
  return ss.str();
}

nlohmann::json parse_json_strict(std::string_view text, const std::string& source, int max_depth) {
  using json = nlohmann::json;
  // One key set per open object; the callback sees object starts, keys and ends in order.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (max_depth >= 0 && depth > max_depth) {
      LT_THROW(ErrorKind::kInput, source, ": JSON nested deeper than ", max_depth, " levels");
    }
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second) {
          LT_THROW(ErrorKind::kInput, source, ": duplicate key '", printable(key),
                   "' in a JSON object");
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    LT_THROW(ErrorKind::kInput, source, ": invalid JSON: ", printable(e.what(), 300));
  }
}

std::string printable(std::string_view s, size_t max_chars) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

nlohmann::json read_json_file(const std::string& path) {
  return parse_json_strict(read_text_file(path), path);
}

}  // namespace leantune
