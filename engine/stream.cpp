// Streams and events on the host and on CUDA devices (see stream.h).
#include "engine/stream.h"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "engine/check.h"
#include "engine/cuda_api.h"

namespace leantune {
namespace {
std::atomic<uint64_t> g_next_host_stream{1};

struct CurrentStreams {
  Stream host{Device::cpu(), 0, nullptr};
  std::vector<Stream> cuda;  // per device; id 0 = not yet created
};
thread_local CurrentStreams t_current;

Stream default_cuda_stream(int index) {
  // One non-default stream per device, shared by all threads unless they set their own.
  static std::mutex mu;
  static std::vector<Stream> streams;
  std::lock_guard<std::mutex> lk(mu);
  if (streams.size() <= static_cast<size_t>(index)) streams.resize(index + 1);
  if (!streams[index].handle) {
    void* h = cuda_stream_create(index);
    streams[index] = Stream{Device::cuda(index), reinterpret_cast<uint64_t>(h), h};
  }
  return streams[index];
}
}  // namespace

void Stream::synchronize() const {
  if (device.is_cuda()) cuda_stream_synchronize(handle);
}

void Stream::wait_stream(const Stream& other) const {
  if (device.is_cuda() && other.device.is_cuda() && *this != other)
    cuda_stream_wait_stream(handle, other.handle);
}

Stream current_stream(Device device) {
  if (device.is_cpu()) return t_current.host;
  auto& v = t_current.cuda;
  if (v.size() <= static_cast<size_t>(device.index)) v.resize(device.index + 1);
  if (!v[device.index].handle) v[device.index] = default_cuda_stream(device.index);
  return v[device.index];
}

void set_current_stream(const Stream& s) {
  if (s.device.is_cpu()) {
    t_current.host = s;
    return;
  }
  auto& v = t_current.cuda;
  if (v.size() <= static_cast<size_t>(s.device.index)) v.resize(s.device.index + 1);
  v[s.device.index] = s;
}

Stream new_stream(Device device) {
  if (device.is_cpu()) return Stream{device, g_next_host_stream++, nullptr};
  void* h = cuda_stream_create(device.index);
  return Stream{device, reinterpret_cast<uint64_t>(h), h};
}

StreamGuard::StreamGuard(const Stream& s) : prev_(current_stream(s.device)) {
  set_current_stream(s);
}
StreamGuard::~StreamGuard() { set_current_stream(prev_); }

Event::Event(Device device) : device_(device) {
  if (device.is_cuda()) handle_ = cuda_event_create(device.index);
}
Event::~Event() {
  if (handle_) {
    try {
      cuda_event_destroy(handle_);
    } catch (...) {
    }
  }
}
Event::Event(Event&& o) noexcept : device_(o.device_), handle_(o.handle_) { o.handle_ = nullptr; }
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (handle_) {
      try {
        cuda_event_destroy(handle_);
      } catch (...) {
      }
    }
    device_ = o.device_;
    handle_ = o.handle_;
    o.handle_ = nullptr;
  }
  return *this;
}
void Event::record(const Stream& s) {
  LT_CHECK(s.device == device_, "event on ", device_.str(), " recorded on ", s.device.str());
  if (handle_) cuda_event_record(handle_, s.handle);
}
bool Event::query() const { return handle_ ? cuda_event_query(handle_) : true; }
void Event::synchronize() const {
  if (handle_) cuda_event_synchronize(handle_);
}
void Event::wait(const Stream& s) const {
  if (handle_ && s.device.is_cuda()) cuda_stream_wait_event(s.handle, handle_);
}
float Event::elapsed_ms(const Event& end) const {
  if (!handle_ || !end.handle_) return 0.0f;
  return cuda_event_elapsed_ms(handle_, end.handle_);
}

void device_synchronize(Device device) {
  if (device.is_cuda()) cuda_device_synchronize(device.index);
}

Stream copy_stream(Device device) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, Stream> streams;
  std::lock_guard<std::mutex> lk(mu);
  const auto key = std::make_pair(static_cast<int>(device.type), device.index);
  auto it = streams.find(key);
  if (it == streams.end()) it = streams.emplace(key, new_stream(device)).first;
  return it->second;
}

void copy_bytes_async(void* dst, const void* src, int64_t n, Device device, CopyKind kind,
                      const Stream& s) {
  if (n <= 0) return;
  if (device.is_cuda())
    cuda_memcpy_async(dst, src, static_cast<size_t>(n), kind, s.handle);
  else
    std::memcpy(dst, src, static_cast<size_t>(n));
}

}  // namespace leantune
