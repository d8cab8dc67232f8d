// safetensors: strict reader (mmap, zero-copy views), atomic writer, sharded HF checkpoints.
//
// Format: an 8-byte little-endian u64 N, then N bytes of header, then the data section.
// The reader validates everything before it trusts anything; each violation is an Error of kind
// kInput whose message names the file and the problem:
//   - the file holds at least 8 bytes; N <= 100,000,000 and 8 + N <= file size;
//   - the header is valid UTF-8, begins with '{', is a single JSON object, and is followed only
//     by space (0x20) padding; nesting deeper than a safetensors header needs is rejected early;
//   - no object in the header has a duplicate key (stricter than the reference reader, whose
//     map silently keeps one value);
//   - "__metadata__", when present, maps strings to strings (null counts as absent);
//   - every other key is a tensor: an object with exactly "dtype" (a known safetensors dtype
//     name), "shape" (an array of non-negative integers, each fitting int64) and
//     "data_offsets" (exactly two non-negative integers [begin, end), begin <= end);
//     unknown keys in a tensor entry are rejected (the reference ignores them);
//   - numel * dtype size is computed with overflow checks and equals end - begin;
//   - sorted by offset, each tensor begins exactly where the previous one ended, the first at
//     0 and the last ends at the end of the data section: no gap, overlap or trailing bytes.
// Where this reader is stricter than the reference (safetensors-rs): duplicate keys, unknown
// keys in a tensor entry, padding other than spaces, NUL bytes in the header, "-0" as an
// integer, dimensions beyond int64 (and non-zero dimensions whose product exceeds int64, even
// in an empty tensor), and dtypes leantune has no DType for (newer reference versions also know
// F4, F6_E2M3, F6_E3M2, F8_E8M0 and C64) are all rejected.
// No allocation is sized from a number in the file before that number has been validated
// against the file's size.
//
// Mappings and lifetime: SafetensorsFile maps the whole file privately (MAP_PRIVATE); only the
// pages a reader touches become resident, and release() gives a tensor's pages back. Tensors
// returned by tensor() are zero-copy host views whose storage holds a reference to the mapping,
// so they stay valid after the SafetensorsFile is dropped. Writes into a view are private to
// this process (copy-on-write) and never reach the file; when the system refuses a writable
// private mapping the file is mapped read-only and views must not be written. A tensor whose
// bytes are not aligned to its element size is returned as an aligned copy instead of a view.
// The writer never truncates or rewrites an existing file in place (temp file + rename), so a
// file that is mapped here keeps its old contents even when the same path is saved again.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/dtype.h"
#include "engine/tensor.h"

namespace leantune {

// The reference reader's cap on the header size (decimal 100 MB), applied on read and write.
constexpr uint64_t kSafetensorsMaxHeaderSize = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // [begin, end) within the data section
};

class SafetensorsFile {
 public:
  // mmap + full validation. Error(kInput) naming the path when the file is missing or invalid.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // offset order
  const SafetensorsEntry* find(const std::string& name) const;               // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Zero-copy host view over the mapping (an aligned copy when the bytes are misaligned).
  // Error(kInput) naming the file when the tensor is absent.
  Tensor tensor(const std::string& name) const;
  // The tensor converted to `dtype` (a view when the dtype already matches).
  Tensor tensor(const std::string& name, DType dtype) const;
  Tensor tensor(const SafetensorsEntry& entry) const;
  // Gives the pages holding `entry`'s bytes back (madvise MADV_DONTNEED; the pages it shares
  // with its neighbours too): a view read afterwards faults them in again from the file, and
  // writes made into its views are lost. Loaders call it once a tensor is copied or quantized,
  // so the file's pages never add up to a second copy of the model in this process.
  void release(const SafetensorsEntry& entry) const;
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t header_size() const { return header_size_; }
  uint64_t data_size() const;

  struct Mapping;  // the mmapped file; shared by every view

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  uint64_t file_size_ = 0;
  uint64_t header_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Validates a header (the JSON text after the 8-byte length, padding included) for a data
// section of data_size bytes. Returns the entries in offset order. `metadata` may be null.
std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view header, uint64_t data_size,
                                                       std::map<std::string, std::string>* metadata,
                                                       const std::string& path_for_errors);

// Validates a whole safetensors file held in memory (length prefix, header, data section).
// This is what open() runs on the mapping and what the fuzz target feeds arbitrary bytes to.
std::vector<SafetensorsEntry> parse_safetensors_buffer(const uint8_t* data, size_t size,
                                                       std::map<std::string, std::string>* metadata,
                                                       const std::string& path_for_errors,
                                                       uint64_t* header_size = nullptr);

// A tensor for the writers below, produced when its turn comes: its dtype and shape are known up
// front (the header comes first), its bytes (any device, any strides) are asked for once, copied
// to the host, written and released before the next tensor is produced, so a writer never holds
// more than one tensor's host copy.
struct TensorSource {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::function<Tensor()> produce;
};

// Writes a safetensors file atomically (fs_util.h). Tensors may live on any device and be
// strided: each is copied to host contiguous memory while it is written. The header is padded
// with spaces to a multiple of 8 bytes and tensors are laid out by decreasing element size, so
// every tensor is aligned to its element size in the file. Names must be unique and may not be
// "__metadata__".
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
void save_safetensors_sources(const std::string& path, const std::vector<TensorSource>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// A .safetensors file, or an HF folder with model.safetensors or model.safetensors.index.json
// (model.safetensors wins when both exist, as in transformers). For a sharded folder every
// shard named in weight_map must exist and be valid; shard names are plain file names inside
// the folder; a tensor found in two shards, a weight_map entry whose shard lacks the tensor and
// a shard tensor that weight_map does not list are errors. Copies share the open files.
class TensorStore {
 public:
  static TensorStore open(const std::string& path);
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;  // Error(kInput) if absent
  Tensor get(const std::string& name) const;                     // zero-copy host view
  Tensor get(const std::string& name, DType dtype) const;        // converted when needed
  void release(const std::string& name) const;  // SafetensorsFile::release of its entry
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  const std::string& path() const { return path_; }
  size_t size() const { return where_.size(); }
  // Sum of numel over all tensors, and of their byte sizes.
  int64_t num_elements() const;
  uint64_t num_bytes() const;

 private:
  struct Location {
    size_t file = 0;
    size_t entry = 0;
  };
  const Location& locate(const std::string& name) const;
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Location> where_;
};

// Writes model.safetensors, or shards model-0000i-of-0000n.safetensors plus
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {...}}, as
// transformers does) when max_shard_bytes > 0 and the total exceeds it. Shards are filled in
// the given order; a tensor larger than the limit gets a shard of its own. Every file carries
// metadata {"format": "pt"} and is written atomically; the index is written after its shards,
// and weight files of an earlier save that the new layout does not use are removed afterwards
// so that loaders never pick up stale weights.
void save_model_tensors(const std::string& dir,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        uint64_t max_shard_bytes = 0);
void save_model_sources(const std::string& dir, const std::vector<TensorSource>& tensors,
                        uint64_t max_shard_bytes = 0);

}  // namespace leantune
