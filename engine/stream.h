// Streams and events. On CUDA a Stream wraps a cudaStream_t and an Event a cudaEvent_t. On the
// host everything executes in order on the calling thread, so CPU streams are logical ids and
// CPU events are complete as soon as they are recorded; the same code paths (copy streams,
// record_stream, wait_event) run on both backends.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/device.h"
#include "engine/scope_guard.h"

namespace leantune {

struct Stream {
  Device device = Device::cpu();
  // Unique per (device, stream): the CUDA handle value, or a logical id on the host.
  uint64_t id = 0;
  void* handle = nullptr;  // cudaStream_t on CUDA, nullptr on the host

  bool operator==(const Stream& o) const { return device == o.device && id == o.id; }
  bool operator!=(const Stream& o) const { return !(*this == o); }
  void synchronize() const;
  // Makes this stream wait for all work queued so far on `other`.
  void wait_stream(const Stream& other) const;
};

// The stream ops run on by default for this device. On CUDA a per-device non-default stream
// created on first use (never the legacy default stream).
Stream current_stream(Device device);
void set_current_stream(const Stream& s);
// A new stream on the device (on the host: a fresh logical id).
Stream new_stream(Device device);
// The process-wide copy stream of a device, for transfers that overlap compute (activation
// offloading, paged optimizer states). One per device: the engine never destroys CUDA streams,
// so a stream per use would leak one each time.
Stream copy_stream(Device device);

class StreamGuard : ScopeGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();

 private:
  Stream prev_;
};

class Event {
 public:
  explicit Event(Device device = Device::cpu());
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;

  void record(const Stream& s);
  bool query() const;  // true when complete (always true on the host)
  void synchronize() const;
  void wait(const Stream& s) const;  // s waits for this event
  // Milliseconds between two recorded events (CUDA only; 0 on the host).
  float elapsed_ms(const Event& end) const;
  Device device() const { return device_; }

 private:
  Device device_;
  void* handle_ = nullptr;  // cudaEvent_t
};

void device_synchronize(Device device);

}  // namespace leantune
