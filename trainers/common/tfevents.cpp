// TensorBoard event files (see tfevents.h).
#include "trainers/common/tfevents.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "engine/check.h"

namespace leantune {

namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32c = crc32c_table();

// Protobuf wire format: varints, fixed-width little-endian numbers, length-delimited fields.
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void put_key(std::string& out, uint32_t field, Wire w) { put_varint(out, (field << 3) | w); }
template <class T>
void put_fixed(std::string& out, uint32_t field, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  put_key(out, field, sizeof(T) == 8 ? kFixed64 : kFixed32);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little endian on every platform leantune builds for
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event{wall_time, step, <what>}: proto3 leaves a zero wall_time and step out.
std::string event(double wall_time, int64_t step, uint32_t what_field, const std::string& what) {
  std::string e;
  if (wall_time != 0) put_fixed(e, 1, wall_time);
  if (step != 0) {
    put_key(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));
  }
  put_bytes(e, what_field, what);
  return e;
}
std::string summary_event(double wall_time, int64_t step, const std::string& value) {
  std::string summary;
  put_bytes(summary, 1, value);
  return event(wall_time, step, 5, summary);
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

double system_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void flatten(const std::string& tag, const nlohmann::json& v, TensorBoardRecord& out) {
  if (v.is_number()) {
    out.scalars.emplace_back(tag, v.get<double>());
  } else if (v.is_string()) {
    out.texts.emplace_back(tag, v.get<std::string>());
  } else if (v.is_object()) {
    for (const auto& [k, sub] : v.items()) flatten(tag + "/" + k, sub, out);
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrc32c[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& data) {
  std::string r;
  const uint64_t len = data.size();
  char head[8];
  std::memcpy(head, &len, 8);
  r.append(head, 8);
  const uint32_t head_crc = masked_crc32c(head, 8);
  r.append(reinterpret_cast<const char*>(&head_crc), 4);
  r += data;
  const uint32_t data_crc = masked_crc32c(data.data(), data.size());
  r.append(reinterpret_cast<const char*>(&data_crc), 4);
  return r;
}

std::string event_file_version(double wall_time) { return event(wall_time, 0, 3, "brain.Event:2"); }

std::string event_scalar(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_fixed(v, 2, value);  // a oneof member: written even when zero
  return summary_event(wall_time, step, v);
}

std::string event_text(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text) {
  std::string dim, shape, tensor, plugin, metadata, v;
  put_key(dim, 1, kVarint);
  put_varint(dim, 1);
  put_bytes(shape, 2, dim);
  put_key(tensor, 1, kVarint);
  put_varint(tensor, 7);  // DT_STRING
  put_bytes(tensor, 2, shape);
  put_bytes(tensor, 8, text);
  put_bytes(plugin, 1, "text");  // TextPluginData{version 0} serializes to nothing
  put_bytes(metadata, 1, plugin);
  put_bytes(v, 1, tag + "/text_summary");
  put_bytes(v, 8, tensor);
  put_bytes(v, 9, metadata);
  return summary_event(wall_time, step, v);
}

TensorBoardRecord tensorboard_record(const nlohmann::json& record) {
  TensorBoardRecord out;
  LT_CHECK(record.is_object(), "tensorboard_record: a record is a JSON object");
  if (record.contains("step") && record["step"].is_number_integer())
    out.step = record["step"].get<int64_t>();
  for (const auto& [k, v] : record.items()) {
    if (k == "step") continue;
    std::string tag;
    if (k.rfind("eval_", 0) == 0)
      tag = "eval/" + k.substr(5);
    else if (k.rfind("test_", 0) == 0)
      tag = "test/" + k.substr(5);
    else
      tag = "train/" + k;
    flatten(tag, v, out);
  }
  return out;
}

std::string tensorboard_log_dir(const std::string& output_dir) {
  if (const char* env = std::getenv("TENSORBOARD_LOGGING_DIR"); env != nullptr && *env != '\0') {
    std::string d = env;
    if (d[0] == '~')
      if (const char* home = std::getenv("HOME")) d = home + d.substr(1);
    return d;
  }
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%b%d_%H-%M-%S", &tm);
  return output_dir + "/runs/" + stamp + "_" + host_name();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, Clock clock)
    : clock_(clock ? std::move(clock) : Clock(system_seconds)) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  LT_CHECK_INPUT(!ec, "tensorboard: cannot create the log folder ", dir, ": ", ec.message());
  const double t0 = now();
  char name[64];
  std::snprintf(name, sizeof name, "%010lld", static_cast<long long>(t0));
  path_ = dir + "/events.out.tfevents." + name + "." + host_name() + "." +
          std::to_string(getpid()) + ".0";
  file_ = std::fopen(path_.c_str(), "wb");
  LT_CHECK_INPUT(file_ != nullptr, "tensorboard: cannot write ", path_, ": ", std::strerror(errno));
  LT_CHECK_INPUT(append(event_file_version(t0)), "tensorboard: cannot write ", path_);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

double TensorBoardWriter::now() const { return clock_(); }

bool TensorBoardWriter::append(const std::string& event) {
  const std::string r = tfrecord(event);
  const long good = std::ftell(file_);
  if (std::fwrite(r.data(), 1, r.size(), file_) == r.size() && std::fflush(file_) == 0) return true;
  // Cut the torn record back out: a reader stops at the first bad checksum.
  std::clearerr(file_);
  if (good >= 0 && ftruncate(fileno(file_), good) == 0) std::fseek(file_, good, SEEK_SET);
  return false;
}

bool TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  return append(event_scalar(now(), step, tag, static_cast<float>(value)));
}

bool TensorBoardWriter::text(const std::string& tag, const std::string& text, int64_t step) {
  return append(event_text(now(), step, tag, text));
}

bool TensorBoardWriter::log(const nlohmann::json& record) {
  const TensorBoardRecord r = tensorboard_record(record);
  bool ok = true;
  for (const auto& [tag, v] : r.scalars) ok = scalar(tag, v, r.step) && ok;
  for (const auto& [tag, s] : r.texts) ok = text(tag, s, r.step) && ok;
  return ok;
}

}  // namespace leantune
