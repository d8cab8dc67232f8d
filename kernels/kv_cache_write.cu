// kv_cache_write on CUDA: pool[slots[t]] = rows[t] (kernels/kv_cache_write.h).
//   pool:[S,W] contiguous, rows:[T,W] (strided rows are copied to contiguous scratch first),
//   slots:[T] host i32|i64, checked on the host (range, distinct) and uploaded as i64.
// One thread block per row (grid-stride over rows), its threads moving the row as 16-byte words
// when the row size and both pointers allow, else as words of the element size. Rows are bytes
// here: no conversion. Distinct slots mean no two blocks write the same row.
#include "engine/cuda_utils.cuh"
#include "kernels/cuda_device.cuh"
#include "kernels/kv_cache_write.h"

namespace leantune::kernels {
namespace {

constexpr int kThreads = 128;

template <typename Word>
__global__ void kv_cache_write_kernel(Word* __restrict__ pool, const int64_t* __restrict__ slots,
                                      const Word* __restrict__ rows, int64_t n, int64_t words) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    Word* dst = pool + slots[r] * words;
    const Word* src = rows + r * words;
    for (int64_t c = threadIdx.x; c < words; c += blockDim.x) dst[c] = src[c];
  }
}

template <typename Word>
void launch_words(void* pool, const int64_t* slots, const void* rows, int64_t n, int64_t row_bytes,
                  int device, cudaStream_t stream) {
  const int64_t words = row_bytes / static_cast<int64_t>(sizeof(Word));
  const unsigned blocks = cu::grid_blocks(n, 1, device, 4, kThreads);
  kv_cache_write_kernel<Word><<<blocks, kThreads, 0, stream>>>(
      static_cast<Word*>(pool), slots, static_cast<const Word*>(rows), n, words);
  CUDA_CHECK_LAUNCH();
}

// pool, slots (device i64) and rows are device pointers; rows are row_bytes apart, packed.
void kv_cache_write_launch(void* pool, const int64_t* slots, const void* rows, int64_t n,
                           int64_t row_bytes, size_t elem_bytes, int device, cudaStream_t stream) {
  if (n == 0 || row_bytes == 0) return;
  if (row_bytes % 16 == 0 && cu::aligned16(pool) && cu::aligned16(rows))
    launch_words<uint4>(pool, slots, rows, n, row_bytes, device, stream);
  else if (elem_bytes == 8)
    launch_words<uint64_t>(pool, slots, rows, n, row_bytes, device, stream);
  else if (elem_bytes == 4)
    launch_words<uint32_t>(pool, slots, rows, n, row_bytes, device, stream);
  else if (elem_bytes == 2)
    launch_words<uint16_t>(pool, slots, rows, n, row_bytes, device, stream);
  else
    launch_words<uint8_t>(pool, slots, rows, n, row_bytes, device, stream);
}

}  // namespace

void kv_cache_write_cuda(const Tensor& pool, const Tensor& slots, const Tensor& rows) {
  const char* op = "kv_cache_write_cuda";
  const Device d = cuda_device_of(pool, op, "pool");
  const std::vector<int64_t> s = kv_cache_checked_slots(pool, slots, rows, op);
  const int64_t n = static_cast<int64_t>(s.size());
  if (n == 0 || pool.size(1) == 0) return;
  cu::DeviceGuard g(d);
  const Tensor rc = cu::contiguous_ws(rows);
  const Tensor sd = cu::on_device_ws(Tensor::from_vector(s, {n}), d);
  kv_cache_write_launch(pool.data_ptr(), static_cast<const int64_t*>(sd.data_ptr()), rc.data_ptr(),
                        n, pool.size(1) * static_cast<int64_t>(pool.element_size()),
                        pool.element_size(), d.index, cu::stream_of(d));
}

}  // namespace leantune::kernels
