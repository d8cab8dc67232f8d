// safetensors reader, writer and sharded store. The validation rules, the mapping lifetime and
// the write protocol are listed in safetensors.h; this file follows them in that order.
#include "loaders/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/check.h"
#include "loaders/fs_util.h"

namespace leantune {

using nlohmann::json;

namespace {

constexpr const char* kMetadataKey = "__metadata__";
// root -> tensor entry -> shape / data_offsets array -> number.
constexpr int kHeaderMaxDepth = 3;
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_u64_le(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
// Returns the offset of the first bad byte, or npos.
size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// A non-negative JSON integer that fits u64; false for negatives, fractions and floats.
bool as_u64(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

std::string json_brief(const json& v) { return printable(v.dump(), 60); }

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v,
                             uint64_t data_size) {
  const std::string where = path + ": tensor '" + printable(name) + "'";
  LT_CHECK_INPUT(v.is_object(), where, " is ", v.type_name(), ", not an object");
  for (const auto& [key, _] : v.items()) {
    LT_CHECK_INPUT(key == "dtype" || key == "shape" || key == "data_offsets", where,
                   " has unknown key '", printable(key), "'");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    LT_CHECK_INPUT(v.contains(key), where, " has no '", key, "'");
  }
  SafetensorsEntry e;
  e.name = name;

  const json& dt = v["dtype"];
  LT_CHECK_INPUT(dt.is_string(), where, " dtype is ", json_brief(dt), ", not a string");
  const auto& dt_name = dt.get_ref<const std::string&>();
  LT_CHECK_INPUT(dtype_from_safetensors_name(dt_name, &e.dtype), where, " has unknown dtype '",
                 printable(dt_name), "'");

  const json& shape = v["shape"];
  LT_CHECK_INPUT(shape.is_array(), where, " shape is ", json_brief(shape), ", not an array");
  // The product of the non-zero dimensions must fit int64 even for an empty tensor, so that
  // element counts and strides computed from the shape later cannot overflow.
  uint64_t product = 1;
  bool overflow = false, has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t d = 0;
    LT_CHECK_INPUT(as_u64(shape[i], &d), where, " shape[", i, "] is ", json_brief(shape[i]),
                   ", not a non-negative integer");
    LT_CHECK_INPUT(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where,
                   " shape[", i, "] = ", d, " is too large");
    e.shape.push_back(static_cast<int64_t>(d));
    if (d == 0) {
      has_zero = true;
    } else {
      overflow = overflow || __builtin_mul_overflow(product, d, &product);
    }
  }
  LT_CHECK_INPUT(!overflow && product <= static_cast<uint64_t>(INT64_MAX), where, " shape ",
                 shape_str(e.shape), ": element count overflows 64 bits");
  const uint64_t numel = has_zero ? 0 : product;
  uint64_t nbytes = 0;
  LT_CHECK_INPUT(!__builtin_mul_overflow(numel, dtype_size(e.dtype), &nbytes), where, " shape ",
                 shape_str(e.shape), ": byte size overflows 64 bits");

  const json& offs = v["data_offsets"];
  LT_CHECK_INPUT(offs.is_array() && offs.size() == 2, where, " data_offsets is ", json_brief(offs),
                 ", not an array [begin, end]");
  LT_CHECK_INPUT(as_u64(offs[0], &e.begin) && as_u64(offs[1], &e.end), where, " data_offsets ",
                 json_brief(offs), " are not non-negative integers");
  LT_CHECK_INPUT(e.begin <= e.end, where, " data_offsets [", e.begin, ", ", e.end,
                 "] end before begin");
  LT_CHECK_INPUT(e.end <= data_size, where, " data_offsets [", e.begin, ", ", e.end,
                 "] out of bounds of the ", data_size, "-byte data section");
  LT_CHECK_INPUT(e.end - e.begin == nbytes, where, " data_offsets [", e.begin, ", ", e.end,
                 "] hold ", e.end - e.begin, " bytes but ", dt_name, " ", shape_str(e.shape),
                 " needs ", nbytes);
  return e;
}

}  // namespace

// ------------------------------------------------------------------------------- parsing

std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view header, uint64_t data_size,
                                                       std::map<std::string, std::string>* metadata,
                                                       const std::string& path) {
  LT_CHECK_INPUT(header.size() <= kSafetensorsMaxHeaderSize, path, ": header of ", header.size(),
                 " bytes exceeds the limit of ", kSafetensorsMaxHeaderSize);
  const size_t bad = find_invalid_utf8(header);
  LT_CHECK_INPUT(bad == std::string_view::npos, path, ": header is not valid UTF-8 (byte ", bad,
                 ")");
  // The JSON parser stops at a NUL byte as if the input ended there; bytes after it would
  // escape validation.
  const size_t nul = header.find('\0');
  LT_CHECK_INPUT(nul == std::string_view::npos, path, ": header contains a NUL byte (byte ", nul,
                 ")");
  LT_CHECK_INPUT(!header.empty() && header.front() == '{', path,
                 ": header does not begin with '{'");
  const size_t last = header.find_last_not_of(' ');
  const std::string_view body = header.substr(0, last + 1);
  const json root = parse_json_strict(body, path + ": header", kHeaderMaxDepth);
  // The JSON parser also skips tabs and newlines; the format allows only space padding.
  LT_CHECK_INPUT(body.back() == '}', path, ": header padding after the JSON object is not spaces");
  LT_CHECK_INPUT(root.is_object(), path, ": header is not a JSON object");

  std::map<std::string, std::string> meta;
  std::vector<SafetensorsEntry> entries;
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (value.is_null()) continue;
      LT_CHECK_INPUT(value.is_object(), path, ": __metadata__ is ", value.type_name(),
                     ", not an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        LT_CHECK_INPUT(mv.is_string(), path, ": __metadata__ value of '", printable(mk), "' is ",
                       json_brief(mv), ", not a string");
        meta.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    entries.push_back(parse_entry(path, key, value, data_size));
  }

  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  uint64_t expected = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : entries) {
    if (e.begin < expected) {
      LT_THROW(ErrorKind::kInput, path, ": tensor '", printable(e.name), "' data_offsets [",
               e.begin, ", ", e.end, "] overlap tensor '", printable(prev->name),
               "' which ends at ", expected);
    }
    if (e.begin > expected) {
      LT_THROW(ErrorKind::kInput, path, ": gap of ", e.begin - expected, " bytes before tensor '",
               printable(e.name), "' at data offset ", expected);
    }
    expected = e.end;
    prev = &e;
  }
  LT_CHECK_INPUT(expected == data_size, path, ": ", data_size - expected,
                 " trailing bytes after the last tensor (data section of ", data_size,
                 " bytes, tensors cover ", expected, ")");
  if (metadata != nullptr) *metadata = std::move(meta);
  return entries;
}

std::vector<SafetensorsEntry> parse_safetensors_buffer(const uint8_t* data, size_t size,
                                                       std::map<std::string, std::string>* metadata,
                                                       const std::string& path,
                                                       uint64_t* header_size) {
  LT_CHECK_INPUT(size >= 8, path, ": file is ", size,
                 " bytes, too short for the 8-byte header length");
  const uint64_t n = read_u64_le(data);
  LT_CHECK_INPUT(n <= kSafetensorsMaxHeaderSize, path, ": header length ", n,
                 " exceeds the limit of ", kSafetensorsMaxHeaderSize, " bytes");
  LT_CHECK_INPUT(n <= size - 8, path, ": header length ", n, " exceeds the ", size - 8,
                 " bytes that follow it in the file");
  if (header_size != nullptr) *header_size = n;
  const std::string_view header(reinterpret_cast<const char*>(data + 8), n);
  return parse_safetensors_header(header, size - 8 - n, metadata, path);
}

// ------------------------------------------------------------------------------- reader

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, size);
  }
};

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LT_CHECK_INPUT(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    LT_THROW(ErrorKind::kInput, path, ": cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    LT_THROW(ErrorKind::kInput, path, ": not a regular file",
             S_ISDIR(st.st_mode) ? " (a directory)" : "");
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(st.st_size);
  if (mapping->size > 0) {
    // Private and writable: writes to views stay in this process. Strict overcommit may refuse
    // a writable mapping of a large file; read-only views are the fallback.
    void* addr = ::mmap(nullptr, mapping->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) addr = ::mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      LT_THROW(ErrorKind::kInput, path, ": cannot map file: ", std::strerror(err));
    }
    mapping->addr = addr;
  }
  ::close(fd);

  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->file_size_ = mapping->size;
  static const uint8_t kNoBytes[1] = {0};
  const auto* bytes = mapping->addr ? static_cast<const uint8_t*>(mapping->addr) : kNoBytes;
  f->entries_ =
      parse_safetensors_buffer(bytes, mapping->size, &f->metadata_, path, &f->header_size_);
  f->mapping_ = std::move(mapping);
  for (size_t i = 0; i < f->entries_.size(); ++i) f->index_.emplace(f->entries_[i].name, i);
  return f;
}

uint64_t SafetensorsFile::data_size() const { return file_size_ - 8 - header_size_; }

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  LT_CHECK_INPUT(e != nullptr, path_, ": no tensor named '", printable(name), "'");
  return tensor(*e);
}

Tensor SafetensorsFile::tensor(const std::string& name, DType dtype) const {
  Tensor t = tensor(name);
  return t.dtype() == dtype ? t : t.to(dtype);
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& e) const {
  LT_CHECK(e.end <= data_size() && e.begin <= e.end, "entry outside ", path_);
  auto* base = static_cast<uint8_t*>(mapping_->addr);
  uint8_t* p = base == nullptr ? nullptr : base + 8 + header_size_ + e.begin;
  const size_t align = dtype_size(e.dtype);
  if (p == nullptr || reinterpret_cast<uintptr_t>(p) % align == 0) {
    return Tensor::from_blob(p, e.shape, e.dtype, Device::cpu(), mapping_);
  }
  // Typed access to misaligned memory is undefined behaviour: hand out an aligned copy.
  Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu(), current_mem_tag());
  if (e.end > e.begin) std::memcpy(t.data_ptr(), p, e.end - e.begin);
  return t;
}

void SafetensorsFile::release(const SafetensorsEntry& e) const {
  LT_CHECK(e.end <= data_size() && e.begin <= e.end, "entry outside ", path_);
  if (mapping_->addr == nullptr || e.end == e.begin) return;
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<uintptr_t>(mapping_->addr);
  const uintptr_t lo = (base + 8 + header_size_ + e.begin) / page * page;
  const uintptr_t hi =
      std::min<uintptr_t>((base + 8 + header_size_ + e.end + page - 1) / page * page,
                          (base + mapping_->size + page - 1) / page * page);
  // Advice only: a refusal leaves the pages resident, which costs memory, never data.
  (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

// ------------------------------------------------------------------------------- writer

namespace {

// Host, contiguous, same dtype and values. Strided host tensors are gathered byte-wise so every
// dtype (u64 beyond 2^53, f8) is copied bit-exactly.
Tensor host_contiguous(const Tensor& tensor) {
  Tensor t = tensor.detach();
  if (!t.device().is_cpu()) {
    if (!t.is_contiguous()) t = t.contiguous();
    t = t.to(Device::cpu());
  }
  if (t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), Device::cpu(), MemTag::kWorkspace);
  const size_t es = t.element_size();
  const auto* src = static_cast<const uint8_t*>(t.storage()->data());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  const int64_t nd = t.dim();
  const int64_t n = t.numel();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = t.offset();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * es, src + off * es, es);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
  return out;
}

void check_names(const std::string& path, const std::vector<TensorSource>& tensors) {
  std::set<std::string> seen;
  for (const TensorSource& t : tensors) {
    LT_CHECK_INPUT(t.name != kMetadataKey, path, ": a tensor may not be named '", kMetadataKey,
                   "'");
    LT_CHECK_INPUT(seen.insert(t.name).second, path, ": tensor name '", printable(t.name),
                   "' given twice");
    LT_CHECK_INPUT(static_cast<bool>(t.produce), path, ": tensor '", printable(t.name),
                   "' is undefined");
  }
}

// model-DDDDD-of-DDDDD.safetensors, the shard names transformers writes.
bool is_shard_name(const std::string& name) {
  static const std::string kPattern = "model-#####-of-#####.safetensors";
  if (name.size() != kPattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const bool digit = name[i] >= '0' && name[i] <= '9';
    if (kPattern[i] == '#' ? !digit : name[i] != kPattern[i]) return false;
  }
  return true;
}

uint64_t tensor_bytes(const TensorSource& t) {
  uint64_t nbytes = 0;
  LT_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(shape_numel(t.shape)), dtype_size(t.dtype),
                                   &nbytes),
           "tensor byte size overflows");
  return nbytes;
}

std::vector<TensorSource> tensor_sources(
    const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<TensorSource> out;
  for (const auto& [name, t] : tensors) {
    TensorSource s{name, t.defined() ? t.dtype() : DType::kF32, t.defined() ? t.shape() : Shape{},
                   nullptr};
    if (t.defined()) s.produce = [t] { return t; };
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors_sources(path, tensor_sources(tensors), metadata);
}

void save_safetensors_sources(const std::string& path, const std::vector<TensorSource>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  check_names(path, tensors);
  // Larger elements first, then by name, like the reference writer: with the header padded to
  // 8 bytes every tensor starts aligned to its element size.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t sa = dtype_size(tensors[a].dtype), sb = dtype_size(tensors[b].dtype);
    if (sa != sb) return sa > sb;
    return tensors[a].name < tensors[b].name;
  });

  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = m;
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorSource& t = tensors[i];
    const uint64_t nbytes = tensor_bytes(t);
    LT_CHECK(!__builtin_add_overflow(offset, nbytes, &offset), "data size overflows");
    header[t.name] = {{"dtype", dtype_safetensors_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset - nbytes, offset}}};
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception&) {
    LT_THROW(ErrorKind::kInput, path, ": tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  LT_CHECK_INPUT(text.size() <= kSafetensorsMaxHeaderSize, path, ": header of ", text.size(),
                 " bytes exceeds the limit of ", kSafetensorsMaxHeaderSize);

  write_file_atomic(path, [&](std::FILE* f) {
    uint8_t prefix[8];
    write_u64_le(text.size(), prefix);
    auto put = [&](const void* p, size_t n) { write_bytes(f, p, n, path); };
    put(prefix, 8);
    put(text.data(), text.size());
    for (size_t i : order) {
      // One tensor's host bytes at a time: produced, written, released.
      const Tensor host = host_contiguous(tensors[i].produce());
      LT_CHECK(host.dtype() == tensors[i].dtype && host.shape() == tensors[i].shape, path,
               ": tensor '", printable(tensors[i].name), "' was announced as ",
               dtype_name(tensors[i].dtype), " ", shape_str(tensors[i].shape), " and came as ",
               host.str());
      put(host.data_ptr(), host.nbytes());
    }
  });
}

// ------------------------------------------------------------------------------- sharded store

TensorStore TensorStore::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  LT_CHECK_INPUT(!ec && fs::exists(st), path, ": no such file or directory");
  TensorStore store;
  store.path_ = path;
  std::string index_path;
  if (fs::is_directory(st)) {
    const std::string single = (fs::path(path) / kSingleFile).string();
    const std::string index = (fs::path(path) / kIndexFile).string();
    if (fs::exists(single, ec)) {
      store.files_.push_back(SafetensorsFile::open(single));
    } else if (fs::exists(index, ec)) {
      index_path = index;
    } else {
      LT_THROW(ErrorKind::kInput, path, ": folder has neither ", kSingleFile, " nor ", kIndexFile);
    }
  } else if (path.size() >= 11 && path.compare(path.size() - 11, 11, ".index.json") == 0) {
    index_path = path;
  } else {
    store.files_.push_back(SafetensorsFile::open(path));
  }

  if (index_path.empty()) {
    const auto& entries = store.files_[0]->entries();
    for (size_t i = 0; i < entries.size(); ++i) store.where_[entries[i].name] = {0, i};
    return store;
  }

  const json index = read_json_file(index_path);
  LT_CHECK_INPUT(index.is_object(), index_path, ": not a JSON object");
  LT_CHECK_INPUT(index.contains("weight_map"), index_path, ": no 'weight_map'");
  const json& wm = index["weight_map"];
  LT_CHECK_INPUT(wm.is_object(), index_path, ": weight_map is not an object");
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shard_names;
  for (const auto& [name, shard] : wm.items()) {
    LT_CHECK_INPUT(shard.is_string(), index_path, ": weight_map entry '", printable(name),
                   "' is not a file name");
    const auto& s = shard.get_ref<const std::string&>();
    // Shards live in the index's folder; a path could reach files outside the model.
    LT_CHECK_INPUT(!s.empty() && s.find('/') == std::string::npos && s != "." && s != "..",
                   index_path, ": weight_map entry '", printable(name), "' names shard '",
                   printable(s), "', not a file name inside the folder");
    weight_map.emplace(name, s);
    shard_names.insert(s);
  }
  const std::string dir = parent_dir(index_path);
  std::map<std::string, size_t> shard_index;
  for (const auto& s : shard_names) {
    const std::string shard_path = (fs::path(dir) / s).string();
    LT_CHECK_INPUT(fs::is_regular_file(shard_path, ec), index_path, ": shard '", printable(s),
                   "' does not exist");
    shard_index[s] = store.files_.size();
    store.files_.push_back(SafetensorsFile::open(shard_path));
  }
  for (size_t fi = 0; fi < store.files_.size(); ++fi) {
    const auto& entries = store.files_[fi]->entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      auto [it, inserted] = store.where_.emplace(entries[i].name, Location{fi, i});
      LT_CHECK_INPUT(inserted, index_path, ": tensor '", printable(entries[i].name),
                     "' is in two shards: '", store.files_[it->second.file]->path(), "' and '",
                     store.files_[fi]->path(), "'");
    }
  }
  for (const auto& [name, loc] : store.where_) {
    auto it = weight_map.find(name);
    LT_CHECK_INPUT(it != weight_map.end(), index_path, ": tensor '", printable(name),
                   "' of shard '", store.files_[loc.file]->path(), "' is not in weight_map");
    LT_CHECK_INPUT(shard_index.at(it->second) == loc.file, index_path, ": weight_map puts '",
                   printable(name), "' in shard '", printable(it->second), "' but it is in '",
                   store.files_[loc.file]->path(), "'");
  }
  for (const auto& [name, shard] : weight_map) {
    LT_CHECK_INPUT(store.where_.count(name) == 1, index_path, ": weight_map lists '",
                   printable(name), "' in shard '", printable(shard),
                   "' but that shard does not contain it");
  }
  return store;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, _] : where_) out.push_back(name);
  return out;
}

bool TensorStore::contains(const std::string& name) const { return where_.count(name) != 0; }

const TensorStore::Location& TensorStore::locate(const std::string& name) const {
  auto it = where_.find(name);
  LT_CHECK_INPUT(it != where_.end(), path_, ": no tensor named '", printable(name), "'");
  return it->second;
}

const SafetensorsEntry& TensorStore::entry(const std::string& name) const {
  const Location& loc = locate(name);
  return files_[loc.file]->entries()[loc.entry];
}

Tensor TensorStore::get(const std::string& name) const {
  const Location& loc = locate(name);
  return files_[loc.file]->tensor(files_[loc.file]->entries()[loc.entry]);
}

void TensorStore::release(const std::string& name) const {
  const Location& loc = locate(name);
  files_[loc.file]->release(files_[loc.file]->entries()[loc.entry]);
}

Tensor TensorStore::get(const std::string& name, DType dtype) const {
  Tensor t = get(name);
  return t.dtype() == dtype ? t : t.to(dtype);
}

int64_t TensorStore::num_elements() const {
  int64_t n = 0;
  for (const auto& [name, loc] : where_) {
    n += shape_numel(files_[loc.file]->entries()[loc.entry].shape);
  }
  return n;
}

uint64_t TensorStore::num_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, loc] : where_) {
    const auto& e = files_[loc.file]->entries()[loc.entry];
    n += e.end - e.begin;
  }
  return n;
}

// ------------------------------------------------------------------------------- model writer

void save_model_tensors(const std::string& dir,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        uint64_t max_shard_bytes) {
  save_model_sources(dir, tensor_sources(tensors), max_shard_bytes);
}

void save_model_sources(const std::string& dir, const std::vector<TensorSource>& tensors,
                        uint64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  check_names(dir, tensors);
  std::error_code ec;
  fs::create_directories(dir, ec);
  LT_CHECK_INPUT(!ec && fs::is_directory(dir), dir, ": cannot create directory: ",
                 ec ? ec.message() : "exists and is not a directory");
  const std::map<std::string, std::string> meta = {{"format", "pt"}};

  uint64_t total = 0;
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t nbytes = tensor_bytes(tensors[i]);
    if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + nbytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += nbytes;
    total += nbytes;
  }

  std::set<std::string> keep;
  if (shards.size() == 1) {
    save_safetensors_sources((fs::path(dir) / kSingleFile).string(), tensors, meta);
    keep.insert(kSingleFile);
  } else {
    const size_t n = shards.size();
    json weight_map = json::object();
    for (size_t s = 0; s < n; ++s) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, n);
      std::vector<TensorSource> part;
      for (size_t i : shards[s]) {
        part.push_back(tensors[i]);
        weight_map[tensors[i].name] = name;
      }
      save_safetensors_sources((fs::path(dir) / name).string(), part, meta);
      keep.insert(name);
    }
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text_atomic((fs::path(dir) / kIndexFile).string(), index.dump(2) + "\n");
    keep.insert(kIndexFile);
  }

  // Weight files of an earlier save would shadow or contradict the new ones.
  bool removed = false;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    const bool weight_file = name == kSingleFile || name == kIndexFile || is_shard_name(name);
    if (weight_file && keep.count(name) == 0) {
      fs::remove(de.path(), ec);
      removed = true;
    }
  }
  if (removed) fsync_dir(dir);
}

}  // namespace leantune
