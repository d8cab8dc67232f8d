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

namespace {

// Builds the DOM while rejecting duplicate keys and nesting deeper than max_depth, and keeps the
// text of each top-level number when asked. A SAX handler, not nlohmann's parse callback: the
// callback parser scans the parent container for discarded values after every object, which
// made an array of n objects (a memory trace's events) take n^2 steps.
class StrictJsonSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  using json = nlohmann::json;
  StrictJsonSax(const std::string& source, int max_depth, std::map<std::string, std::string>* raw,
                const char* what, const JsonArrayStream* stream)
      : source_(source), max_depth_(max_depth), raw_(raw), what_(what), stream_(stream) {}
  json& root() { return root_; }

  bool null() override { return add(nullptr); }
  bool boolean(bool v) override { return add(v); }
  bool number_integer(number_integer_t v) override { return add(v); }
  bool number_unsigned(number_unsigned_t v) override { return add(v); }
  bool number_float(number_float_t v, const string_t& text) override {
    put(json(v), &text);
    return true;
  }
  bool string(string_t& v) override { return add(v); }
  bool binary(binary_t&) override { return add(nullptr); }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return open(json::object());
  }
  bool key(string_t& k) override {
    if (!keys_.back().insert(k).second)
      LT_THROW(ErrorKind::kInput, source_, ": duplicate key '", printable(k), "' in a JSON object");
    key_ = k;
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    close();
    return true;
  }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_array() override {
    close();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    LT_THROW(ErrorKind::kInput, source_, ": invalid ", what_, ": ", printable(e.what(), 300));
  }

 private:
  json* put(json v, const string_t* text) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (&top == streamed_) {
      // An element of the streamed array: handed over now, or once complete (a container).
      if (!v.is_structured()) {
        stream_->element(std::move(v));
        return nullptr;
      }
      element_ = std::move(v);
      return &element_;
    }
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    if (stack_.size() == 1 && raw_ != nullptr) {
      if (text != nullptr)
        (*raw_)[key_] = *text;
      else
        raw_->erase(key_);
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool add(json v) {
    put(std::move(v), nullptr);
    return true;
  }
  // Root = depth 0: a container opened with d containers already open is at depth d + 1.
  bool open(json container) {
    if (max_depth_ >= 0 && static_cast<int>(stack_.size()) > max_depth_)
      LT_THROW(ErrorKind::kInput, source_, ": JSON nested deeper than ", max_depth_, " levels");
    const bool streamed = stream_ != nullptr && stack_.size() == 1 && root_.is_object() &&
                          container.is_array() && key_ == stream_->key;
    stack_.push_back(put(std::move(container), nullptr));
    if (streamed) streamed_ = stack_.back();
    return true;
  }
  void close() {
    const bool element_done = stack_.size() == 3 && stack_[1] == streamed_;
    stack_.pop_back();
    if (element_done) {
      stream_->element(std::move(element_));
      element_ = json();
    }
  }

  const std::string& source_;
  int max_depth_;
  std::map<std::string, std::string>* raw_;
  const char* what_;
  const JsonArrayStream* stream_;
  json* streamed_ = nullptr;  // the streamed array in root_ (kept empty)
  json element_;              // its element being parsed
  json root_;
  std::vector<json*> stack_;
  std::vector<std::set<std::string>> keys_;
  std::string key_;
};

}  // namespace

nlohmann::json parse_json_strict(std::string_view text, const std::string& source, int max_depth,
                                 std::map<std::string, std::string>* top_level_numbers,
                                 const char* what, const JsonArrayStream* stream) {
  StrictJsonSax sax(source, max_depth, top_level_numbers, what, stream);
  nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  return std::move(sax.root());
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
