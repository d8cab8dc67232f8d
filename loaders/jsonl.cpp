// Streaming JSONL reading and line validation (see jsonl.h for the contract).
#include "loaders/jsonl.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "engine/check.h"
#include "engine/enum_names.h"

namespace leantune {

const char* bad_line_kind_name(BadLineKind kind) {
  static constexpr const char* kNames[] = {
      "invalid_utf8", "lone_surrogate", "invalid_json", "not_object",      "missing_key",
      "wrong_type",   "empty_text",     "out_of_range", "format_mismatch", "tokenizer_error"};
  static_assert(std::size(kNames) == kNumBadLineKinds);
  return enum_name(kind, kNames, "unknown");
}

void BadLineCounts::add(BadLineKind kind, const std::string& where_and_what) {
  ++counts[static_cast<int>(kind)];
  if (examples.size() < kMaxExamples) examples.push_back(where_and_what);
}

void BadLineCounts::merge(const BadLineCounts& other) {
  for (int k = 0; k < kNumBadLineKinds; ++k) counts[k] += other.counts[k];
  for (const std::string& e : other.examples) {
    if (examples.size() < kMaxExamples) examples.push_back(e);
  }
}

int64_t BadLineCounts::total() const {
  int64_t t = 0;
  for (int64_t c : counts) t += c;
  return t;
}

std::string BadLineCounts::summary() const {
  const int64_t t = total();
  if (t == 0) return "no bad lines";
  std::string s = std::to_string(t) + (t == 1 ? " bad line skipped: " : " bad lines skipped: ");
  bool first = true;
  for (int k = 0; k < kNumBadLineKinds; ++k) {
    if (counts[k] == 0) continue;
    if (!first) s += ", ";
    first = false;
    s += bad_line_kind_name(static_cast<BadLineKind>(k));
    s += ' ';
    s += std::to_string(counts[k]);
  }
  return s;
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, eight bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Ranges of RFC 3629 / Unicode Table 3-7 (well-formed byte sequences).
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;  // would encode U+D800..U+DFFF
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The code unit of a "\uXXXX" escape starting at s[i] (the backslash), or -1.
int escape_unit(std::string_view s, size_t i) {
  if (i + 6 > s.size() || s[i] != '\\' || s[i + 1] != 'u') return -1;
  int v = 0;
  for (size_t k = 2; k < 6; ++k) {
    const int h = hex_value(s[i + k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

}  // namespace

size_t find_lone_surrogate_escape(std::string_view s) {
  size_t i = s.find('\\');
  while (i != std::string_view::npos && i + 1 < s.size()) {
    if (s[i + 1] != 'u') {
      i = s.find('\\', i + 2);  // skips the escaped character, "\\\\" included
      continue;
    }
    const int unit = escape_unit(s, i);
    if (unit < 0) {
      i = s.find('\\', i + 2);  // malformed escape: the JSON parser reports it
      continue;
    }
    if (unit >= 0xDC00 && unit <= 0xDFFF) return i;
    if (unit >= 0xD800 && unit <= 0xDBFF) {
      const int next = escape_unit(s, i + 6);
      if (next < 0xDC00 || next > 0xDFFF) return i;
      i = s.find('\\', i + 12);
      continue;
    }
    i = s.find('\\', i + 6);
  }
  return std::string_view::npos;
}

bool parse_json_line(std::string_view line, nlohmann::json* out, LineProblem* problem) {
  const size_t bad = find_invalid_utf8(line);
  if (bad != std::string_view::npos) {
    problem->kind = BadLineKind::kInvalidUtf8;
    problem->message = "invalid UTF-8 at byte " + std::to_string(bad + 1);
    return false;
  }
  if (line.find("\\u") != std::string_view::npos) {
    const size_t lone = find_lone_surrogate_escape(line);
    if (lone != std::string_view::npos) {
      problem->kind = BadLineKind::kLoneSurrogate;
      problem->message = "lone surrogate escape '" + std::string(line.substr(lone, 6)) +
                         "' at byte " + std::to_string(lone + 1);
      return false;
    }
  }
  try {
    *out = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    // A syntax error or a number beyond a double (out_of_range.406). Drop nlohmann's
    // "[json.exception.parse_error.101] " prefix; the rest names the column.
    std::string what = e.what();
    const size_t close = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
      what = what.substr(close + 2);
    }
    problem->kind = BadLineKind::kInvalidJson;
    problem->message = "invalid JSON: " + what;
    return false;
  }
  if (!out->is_object()) {
    problem->kind = BadLineKind::kNotObject;
    problem->message = std::string("expected a JSON object, got ") + out->type_name();
    return false;
  }
  return true;
}

JsonlReader::JsonlReader(JsonlSource source)
    : path_(std::move(source.path)), rows_(std::move(source.rows)) {
  if (rows_) return;
  file_ = std::fopen(path_.c_str(), "rb");
  LT_CHECK_INPUT(file_ != nullptr, path_, ": cannot open dataset: ", std::strerror(errno));
  // A large stdio buffer: lines are usually short, and getline copies out of it.
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
}

JsonlReader::~JsonlReader() {
  if (file_ != nullptr) std::fclose(file_);
  std::free(buf_);
}

bool JsonlReader::next_line(std::string_view* line) {
  while (rows_) {
    if (line_number_ >= static_cast<int64_t>(rows_->size())) return false;
    const std::string& row = (*rows_)[static_cast<size_t>(line_number_++)];
    if (row.find_first_not_of(" \t\r\n") == std::string::npos) {
      ++blank_lines_;
      continue;
    }
    *line = row;
    return true;
  }
  while (true) {
    errno = 0;
    const ssize_t n = getline(&buf_, &cap_, file_);
    if (n < 0) {
      LT_CHECK_INPUT(!std::ferror(file_), path_, ":", line_number_ + 1,
                     ": read error: ", std::strerror(errno));
      return false;
    }
    ++line_number_;
    size_t len = static_cast<size_t>(n);
    while (len > 0 && (buf_[len - 1] == '\n' || buf_[len - 1] == '\r')) --len;
    size_t first = 0;
    while (first < len && (buf_[first] == ' ' || buf_[first] == '\t' || buf_[first] == '\r')) {
      ++first;
    }
    if (first == len) {
      ++blank_lines_;
      continue;
    }
    *line = std::string_view(buf_, len);
    return true;
  }
}

std::string JsonlReader::where() const { return path_ + ":" + std::to_string(line_number_) + ": "; }

}  // namespace leantune
