// Atomic file output, file reading and strict JSON parsing, used by the safetensors reader and
// writer, the model config and checkpoints.
//
// Atomic write contract: the content goes to a fresh temporary file in the destination's own
// directory (so the rename cannot cross file systems), is flushed and fsynced, then renamed
// over the destination, and the directory is fsynced so the rename itself is durable. A file
// carrying the final name is therefore either the old complete file or the new complete file,
// never a half-written one; after a crash at most a stray "<name>.tmp.*" file remains. The old
// file is replaced, never truncated, so readers that still map it keep seeing the old bytes.
//
// Every failure throws leantune::Error of kind kInput naming the path and the system error
// (a bad output directory, a full disk and a missing input are problems of the user's setup).
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace leantune {

// Writes via a temp file in the same directory, fsync, rename, fsync of the directory.
// `write` produces the content on the stream; if it throws, the temp file is removed and the
// destination is untouched. Write errors reported by the stream are detected and thrown.
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write);
void write_text_atomic(const std::string& path, const std::string& text);
// Writes `size` bytes to `f`; Error(kInput) "<path>: write failed: <reason>" (e.g. "No space left
// on device", "File too large") when the stream takes fewer.
void write_bytes(std::FILE* f, const void* data, size_t size, const std::string& path);
// Copies the file `src` to `dst` with write_file_atomic: `dst` is never left half-written.
// Errors name the file (src for a failed read, dst for a failed write) and the reason.
void copy_file_atomic(const std::string& src, const std::string& dst);
// fsync of a directory, making renames and creations inside it durable.
void fsync_dir(const std::string& dir);
// The whole file as bytes. Error(kInput) naming the path on failure.
std::string read_text_file(const std::string& path);
// The directory part of a path ("." for a bare file name).
std::string parent_dir(const std::string& path);

// Parses JSON text strictly: a duplicate key in any object is an error (nlohmann::json alone
// silently keeps the last value), and so is nesting deeper than max_depth (root = depth 0;
// negative = unlimited), checked while parsing so deep input is rejected before it is built.
// Errors are kind kInput and name `source`.
// top_level_numbers (optional) receives the text of each floating-point number of the root
// object as written; `what` names the text in the syntax error ("invalid <what>: ...").
// stream (optional): the elements of one array of the root object are handed to stream->element
// one by one as each is parsed, and not kept (the root holds an empty array there), so that a
// file of millions of records is never held as one DOM.
struct JsonArrayStream {
  std::string key;
  std::function<void(nlohmann::json&&)> element;
};
nlohmann::json parse_json_strict(std::string_view text, const std::string& source,
                                 int max_depth = -1,
                                 std::map<std::string, std::string>* top_level_numbers = nullptr,
                                 const char* what = "JSON",
                                 const JsonArrayStream* stream = nullptr);
// A name from a file, made safe for a one-line message: control and non-ASCII bytes become
// \xHH escapes and text beyond max_chars is cut with "...".
std::string printable(std::string_view s, size_t max_chars = 120);
// read_text_file + parse_json_strict.
nlohmann::json read_json_file(const std::string& path);

}  // namespace leantune
