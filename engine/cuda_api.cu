// The CUDA runtime behind engine/cuda_api.h: device and pinned backings for the caching
// allocator, streams, events and copies. Every runtime call is checked.
// An event must be created on, and recorded from, the device of the stream it is recorded on
// (else cudaErrorInvalidResourceHandle); with several GPUs the current device is often another
// one, so every create + record below runs under a guard for the stream's own device.
// cudaStreamWaitEvent itself may wait on an event of another device.
#include <cuda_runtime.h>

#include "engine/check.h"
#include "engine/cuda_api.h"
#include "engine/enum_names.h"

namespace leantune {
namespace {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) CUDA_CHECK(cudaSetDevice(device));
    target_ = device;
  }
  ~DeviceGuard() {
    if (prev_ != target_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  int target_ = 0;
};

// The device a stream belongs to (the current device for the legacy default stream).
int stream_device(void* stream) {
  int d = 0;
  CUDA_CHECK(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &d));
  return d;
}

// An event recorded now on a CUDA stream, created on that stream's device.
cudaEvent_t record_on(const Stream& s) {
  DeviceGuard g(s.device.index);
  cudaEvent_t ev;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(s.handle)));
  return ev;
}

// What an allocation call returns: the block, or nullptr when the device or host is out of
// memory (the caching allocator then frees cached blocks and retries); other errors throw.
void* allocated_or_null(cudaError_t err, void* p) {
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so later checks are not confused
    return nullptr;
  }
  CUDA_CHECK(err);
  return p;
}

// The events both backings share: a freed block is reused only after the CUDA streams that use
// it are done. The stream may belong to another device (a peer reading this memory).
class CudaEventBacking : public MemoryBacking {
 public:
  void* event_record(const Stream& s) override {
    if (!s.device.is_cuda()) return nullptr;
    return record_on(s);
  }
  bool event_query(void* ev) override { return cuda_event_query(ev); }
  void event_destroy(void* ev) override { cuda_event_destroy(ev); }
};

class CudaDeviceBacking final : public CudaEventBacking {
 public:
  explicit CudaDeviceBacking(int device) : device_(device) {}
  Device device() const override { return Device::cuda(device_); }
  void* raw_alloc(size_t bytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    return allocated_or_null(err, p);
  }
  void raw_free(void* ptr, size_t) override {
    DeviceGuard g(device_);
    CUDA_CHECK(cudaFree(ptr));
  }
  void synchronize() override {
    DeviceGuard g(device_);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::string name() const override { return "cuda:" + std::to_string(device_); }

 private:
  int device_;
};

class CudaPinnedBacking final : public CudaEventBacking {
 public:
  Device device() const override { return Device::cpu(); }
  void* raw_alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    return allocated_or_null(err, p);
  }
  void raw_free(void* ptr, size_t) override { CUDA_CHECK(cudaFreeHost(ptr)); }
  void synchronize() override { CUDA_CHECK(cudaDeviceSynchronize()); }
  std::string name() const override { return "pinned host"; }
};

cudaMemcpyKind to_cuda(CopyKind k) {
  static constexpr cudaMemcpyKind kKinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                              cudaMemcpyDeviceToDevice, cudaMemcpyHostToHost};
  static_assert(std::size(kKinds) == static_cast<size_t>(CopyKind::kHostToHost) + 1);
  return enum_lookup(k, kKinds, cudaMemcpyDefault);
}

}  // namespace

int cuda_device_count_impl() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: a CPU-only run
    return 0;
  }
  return n;
}

std::unique_ptr<MemoryBacking> cuda_make_device_backing(int device) {
  return std::make_unique<CudaDeviceBacking>(device);
}
std::unique_ptr<MemoryBacking> cuda_make_pinned_backing() {
  return std::make_unique<CudaPinnedBacking>();
}

void cuda_set_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

void* cuda_stream_create(int device) {
  DeviceGuard g(device);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
void cuda_stream_synchronize(void* stream) {
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}
void cuda_stream_wait_stream(void* stream, void* other) {
  cudaEvent_t ev;
  {
    DeviceGuard g(stream_device(other));
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(other)));
  }
  DeviceGuard g(stream_device(stream));
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev, 0));
  CUDA_CHECK(cudaEventDestroy(ev));  // released once the wait has been satisfied
}
void* cuda_event_create(int device) {
  DeviceGuard g(device);
  cudaEvent_t ev;
  CUDA_CHECK(cudaEventCreate(&ev));
  return ev;
}
void cuda_event_destroy(void* ev) { CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(ev))); }
void cuda_event_record(void* ev, void* stream) {
  DeviceGuard g(stream_device(stream));
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(stream)));
}
bool cuda_event_query(void* ev) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(ev));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  CUDA_CHECK(err);
  return true;
}
void cuda_event_synchronize(void* ev) {
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)));
}
void cuda_stream_wait_event(void* stream, void* ev) {
  CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(ev), 0));
}
float cuda_event_elapsed_ms(void* start, void* end) {
  float ms = 0;
  CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}
void cuda_device_synchronize(int device) {
  DeviceGuard g(device);
  CUDA_CHECK(cudaDeviceSynchronize());
}
void cuda_memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_cuda(kind), static_cast<cudaStream_t>(stream)));
}
void cuda_memset_async(void* dst, int value, size_t bytes, void* stream) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
}
void cuda_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  DeviceGuard g(device);
  CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}
std::string cuda_device_name(int device) {
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

}  // namespace leantune
