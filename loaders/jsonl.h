// Streaming JSONL input with strict per-line validation.
//
// Contract: a JSONL file is read one line at a time in constant memory (plus the longest line);
// nothing is ever loaded whole. Every line is checked, in this order, and a failing line gets
// exactly one category:
//   invalid_utf8    the raw bytes are not well-formed UTF-8 (overlongs, UTF-8-encoded surrogates
//                   and code points above U+10FFFF included)
//   lone_surrogate  a \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF escape, or a low
//                   surrogate escape without a high one before it
//   invalid_json    anything else the JSON parser rejects (trailing garbage included)
//   not_object      valid JSON that is not an object
// Later checks (dataset.h) add missing_key, wrong_type, empty_text, out_of_range and
// format_mismatch (a row whose keys make another format than the file's first row), and
// tokenisation (examples.h) tokenizer_error.
// Blank lines (only spaces, tabs, \r) are not data: they are skipped and counted.
// Rows given in memory (an embedder's, public API) are read as the lines of a file named by the
// source's name: row i is line i + 1, and gets the same checks.
//
// API
//   JsonlReader r(path);                     // throws Error(kInput) when it cannot be opened
//   while (r.next_line(&sv)) ... r.line_number()   // 1-based line of sv
//   bool parse_json_line(sv, &json, &problem)      // false + problem on a bad line
//   size_t find_invalid_utf8(sv) / find_lone_surrogate_escape(sv)   // npos when fine
//   BadLineCounts: counts per BadLineKind, total(), summary() ("3 bad lines skipped: ...")
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace leantune {

enum class BadLineKind : int {
  kInvalidUtf8 = 0,
  kLoneSurrogate,
  kInvalidJson,
  kNotObject,
  kMissingKey,
  kWrongType,
  kEmptyText,
  kOutOfRange,
  kFormatMismatch,  // a key the file's format (detected on its first row) does not use
  kTokenizer,       // the tokenizer or chat template refused the example (e.g. an unknown role)
  kCount,
};
constexpr int kNumBadLineKinds = static_cast<int>(BadLineKind::kCount);

// Stable snake_case name used in reports ("missing_key").
const char* bad_line_kind_name(BadLineKind kind);

struct LineProblem {
  BadLineKind kind = BadLineKind::kInvalidJson;
  std::string message;  // without the "file:line: " prefix
};

// Skipped lines by category, plus the first few messages so that a report can show examples.
struct BadLineCounts {
  static constexpr size_t kMaxExamples = 5;
  std::array<int64_t, kNumBadLineKinds> counts{};
  std::vector<std::string> examples;  // "file:line: message", at most kMaxExamples

  void add(BadLineKind kind, const std::string& where_and_what);
  void merge(const BadLineCounts& other);
  int64_t count(BadLineKind kind) const { return counts[static_cast<int>(kind)]; }
  int64_t total() const;
  // "no bad lines" or "4 bad lines skipped: invalid_json 1, missing_key 3".
  std::string summary() const;
};

// Byte offset of the first ill-formed UTF-8 sequence in s, or std::string_view::npos.
size_t find_invalid_utf8(std::string_view s);
// Byte offset of the first \u escape that leaves a surrogate unpaired, or npos. Escaped
// backslashes ("\\u...") are not escapes of u.
size_t find_lone_surrogate_escape(std::string_view s);

// Validates and parses one line. On failure returns false and describes the problem.
bool parse_json_line(std::string_view line, nlohmann::json* out, LineProblem* problem);

// Where JSONL rows come from: a file, or rows in memory (one JSON text each) named `path` in
// messages.
struct JsonlSource {
  JsonlSource(std::string file) : path(std::move(file)) {}  // NOLINT: a path is a source
  JsonlSource(std::string name, std::shared_ptr<const std::vector<std::string>> in_memory)
      : path(std::move(name)), rows(std::move(in_memory)) {}
  std::string path;
  std::shared_ptr<const std::vector<std::string>> rows;  // set: read these, not a file
};

class JsonlReader {
 public:
  explicit JsonlReader(JsonlSource source);
  ~JsonlReader();
  JsonlReader(const JsonlReader&) = delete;
  JsonlReader& operator=(const JsonlReader&) = delete;

  // The next non-blank line without its line terminator; false at end of file. The view stays
  // valid until the next call.
  bool next_line(std::string_view* line);
  int64_t line_number() const { return line_number_; }
  int64_t blank_lines() const { return blank_lines_; }
  const std::string& path() const { return path_; }
  // "path:line: " prefix for messages about the current line.
  std::string where() const;

 private:
  std::string path_;
  std::shared_ptr<const std::vector<std::string>> rows_;
  FILE* file_ = nullptr;
  char* buf_ = nullptr;
  size_t cap_ = 0;
  int64_t line_number_ = 0;
  int64_t blank_lines_ = 0;
};

}  // namespace leantune
