// CPU-only build: the CUDA door exists and reports that there is no device.
#ifndef LEANTUNE_WITH_CUDA
#include "engine/check.h"
#include "engine/cuda_api.h"

namespace leantune {
namespace {
[[noreturn]] void no_cuda() { LT_THROW_NO_CUDA("cuda"); }
}  // namespace

int cuda_device_count_impl() { return 0; }
std::unique_ptr<MemoryBacking> cuda_make_device_backing(int) { no_cuda(); }
std::unique_ptr<MemoryBacking> cuda_make_pinned_backing() { no_cuda(); }
void cuda_set_device(int) { no_cuda(); }
void* cuda_stream_create(int) { no_cuda(); }
void cuda_stream_synchronize(void*) { no_cuda(); }
void cuda_stream_wait_stream(void*, void*) { no_cuda(); }
void* cuda_event_create(int) { no_cuda(); }
void cuda_event_destroy(void*) { no_cuda(); }
void cuda_event_record(void*, void*) { no_cuda(); }
bool cuda_event_query(void*) { no_cuda(); }
void cuda_event_synchronize(void*) { no_cuda(); }
void cuda_stream_wait_event(void*, void*) { no_cuda(); }
float cuda_event_elapsed_ms(void*, void*) { no_cuda(); }
void cuda_device_synchronize(int) { no_cuda(); }
void cuda_memcpy_async(void*, const void*, size_t, CopyKind, void*) { no_cuda(); }
void cuda_memset_async(void*, int, size_t, void*) { no_cuda(); }
void cuda_mem_get_info(int, size_t*, size_t*) { no_cuda(); }
std::string cuda_device_name(int) { no_cuda(); }

}  // namespace leantune
#endif
