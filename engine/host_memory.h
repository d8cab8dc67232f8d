// Host memory under an address-space limit (ulimit -v, RLIMIT_AS).
//
// OpenBLAS takes a GEMM work buffer (128 MiB on x86-64 builds) from a table of slots for every
// thread that runs a GEMM, keeps it mapped after the call, and when mapping a new one fails it
// retries forever (blas_memory_alloc's loop): a run that reaches the limit mid-training hangs
// instead of failing. So, under a limit, prepare_host_memory() reserves one slot per OpenMP
// thread (plus the caller's) at once, while there is room; later GEMMs only reuse them. When
// even that does not fit, it lowers the thread count until it does, and when one thread does
// not fit it is an Error(kOutOfMemory) naming the limit. Then it caps the CPU caching allocator
// so that it refuses (exit 3, naming the tag) before malloc or OpenBLAS could fail: at
// max_memory_gib when given, else at 80% of the address space the limit still leaves (the rest
// is for memory outside the allocator: the dataset, the tokenizer, libraries' own buffers).
#pragma once

#include <cstdint>
#include <string>

namespace leantune {

struct HostMemoryPlan {
  int64_t address_limit = 0;  // RLIMIT_AS in bytes (0 = none)
  int64_t mapped = 0;         // address space in use after the reservation
  int threads = 0;            // OpenMP threads after any reduction
  int blas_buffers = 0;       // OpenBLAS buffer slots reserved
  int64_t cap = 0;            // the CPU allocator's limit (0 = none)
  std::string summary() const;
};

// max_memory_gib > 0: the CPU allocator's cap in GiB; 0: derived from RLIMIT_AS (none without
// a limit). Call once, before the model is built.
HostMemoryPlan prepare_host_memory(double max_memory_gib);

// Whether the address space left under RLIMIT_AS (always, without a limit) holds the OpenBLAS
// buffers prepare_host_memory() needs at the least: the calling thread's and one worker's.
bool blas_buffers_fit();

}  // namespace leantune
