// TensorBoard event files (`--report_to tensorboard`), written as torch.utils.tensorboard's
// SummaryWriter writes them and transformers' TensorBoardCallback fills them, with no protobuf or
// TensorFlow library.
//
// File: events.out.tfevents.<10-digit unix time>.<host>.<pid>.0 in the log folder
// (TENSORBOARD_LOGGING_DIR, else <output_dir>/runs/<%b%d_%H-%M-%S>_<host>, transformers' rule).
// Each record: u64 length (little endian), u32 masked CRC-32C of those 8 bytes, the serialized
// Event protobuf, u32 masked CRC-32C of it (mask: rotate right 15, add 0xa282ead8). The first
// event says file_version "brain.Event:2".
// Event (tensorflow/core/util/event.proto): wall_time 1 (double), step 2 (int64), file_version 3,
// summary 5. A scalar is Summary.Value{tag 1, simple_value 2 (float)}, as SummaryWriter.add_scalar
// writes it; a text is Summary.Value{tag "<tag>/text_summary" 1, tensor 8 (DT_STRING, shape [1]),
// metadata 9 (plugin "text")}, as add_text writes it. Fields are emitted in field-number order
// with proto3's rule (zero scalars outside a oneof omitted), so the bytes equal Python's.
// A training record maps as TensorBoardCallback.on_log maps its logs: "eval_x" -> "eval/x",
// "test_x" -> "test/x", anything else -> "train/x"; the step is the record's "step". leantune's
// nested objects (memory) are flattened with "/" ("train/memory/peak_allocated"); strings are
// texts; booleans and arrays are left out.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace leantune {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), continuing from `crc`.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked CRC-32C.
uint32_t masked_crc32c(const void* data, size_t n);
// One framed record holding `data`.
std::string tfrecord(const std::string& data);

// Serialized Event protobufs.
std::string event_file_version(double wall_time);
std::string event_scalar(double wall_time, int64_t step, const std::string& tag, float value);
std::string event_text(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text);

// What one training or evaluation record becomes: its step, scalars and texts.
struct TensorBoardRecord {
  int64_t step = 0;
  std::vector<std::pair<std::string, double>> scalars;
  std::vector<std::pair<std::string, std::string>> texts;
};
TensorBoardRecord tensorboard_record(const nlohmann::json& record);

// transformers' log folder: $TENSORBOARD_LOGGING_DIR, else output_dir/runs/<time>_<host>.
std::string tensorboard_log_dir(const std::string& output_dir);

// One event file, appended and flushed record by record. A failed write (a full disk) is
// reported by the return value and the file keeps only whole records: training goes on.
class TensorBoardWriter {
 public:
  using Clock = std::function<double()>;  // seconds since the epoch
  // Creates `dir` and the file (named with the clock's first reading); throws kInput naming the
  // folder when it cannot be made.
  explicit TensorBoardWriter(const std::string& dir, Clock clock = {});
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  bool scalar(const std::string& tag, double value, int64_t step);
  bool text(const std::string& tag, const std::string& text, int64_t step);
  // Every scalar and text of tensorboard_record(record); false if any write failed.
  bool log(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  bool append(const std::string& event);
  double now() const;
  std::string path_;
  std::FILE* file_ = nullptr;
  Clock clock_;
};

}  // namespace leantune
