// The engine's narrow door to the CUDA runtime: backings for the caching allocator, streams,
// events, copies and device queries. Defined in cuda_api.cu (libleantune_cuda); libleantune
// reaches them through the backend table (engine/cuda_entry_points.h), so the rest of the engine
// never needs #ifdefs and a build or machine without CUDA gets one clear error. Handles are
// opaque pointers (cudaStream_t, cudaEvent_t).
#pragma once

#include <cstddef>
#include <memory>

#include "engine/allocator.h"

namespace leantune {

int cuda_device_count_impl();
std::unique_ptr<MemoryBacking> cuda_make_device_backing(int device);
std::unique_ptr<MemoryBacking> cuda_make_pinned_backing();

void cuda_set_device(int device);
void* cuda_stream_create(int device);
void cuda_stream_synchronize(void* stream);
void cuda_stream_wait_stream(void* stream, void* other);
void* cuda_event_create(int device);
void cuda_event_destroy(void* ev);
void cuda_event_record(void* ev, void* stream);
bool cuda_event_query(void* ev);
void cuda_event_synchronize(void* ev);
void cuda_stream_wait_event(void* stream, void* ev);
float cuda_event_elapsed_ms(void* start, void* end);
void cuda_device_synchronize(int device);

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };

// n bytes queued on stream s when `device` is a CUDA device (cuda_memcpy_async), copied at once
// with memcpy on the host (where streams are logical). Nothing for n <= 0.
void copy_bytes_async(void* dst, const void* src, int64_t n, Device device, CopyKind kind,
                      const Stream& s);
// Asynchronous on `stream`; host memory should be pinned for real overlap.
void cuda_memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream);
void cuda_memset_async(void* dst, int value, size_t bytes, void* stream);
void cuda_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes);
// Name of the device ("NVIDIA H100 80GB HBM3").
std::string cuda_device_name(int device);
// An NVTX range (engine/profile.h's op names), seen by Nsight Systems; nested ranges nest. NVTX
// returns no error to check: without a tool attached both calls do nothing.
void nvtx_range_push(const char* name);
void nvtx_range_pop();

}  // namespace leantune
