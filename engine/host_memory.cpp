// See host_memory.h. The OpenBLAS entry points are weak references: with another BLAS they are
// null and only the allocator cap applies.
#include "engine/host_memory.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"

extern "C" {
void* blas_memory_alloc(int procpos) __attribute__((weak));
void blas_memory_free(void* buffer) __attribute__((weak));
void openblas_set_num_threads(int num_threads) __attribute__((weak));
}

namespace leantune {

namespace {
constexpr int64_t kMiB = int64_t{1} << 20;
// OpenBLAS's largest x86-64 BUFFER_SIZE plus its guard page, and a thread's stack and slack.
constexpr int64_t kBlasBuffer = 129 * kMiB;
constexpr int64_t kPerThread = kBlasBuffer + 16 * kMiB;
// Address space kept for everything else while reserving.
constexpr int64_t kHeadroom = 64 * kMiB;

int64_t mapped_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmSize:") {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

int64_t address_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    return static_cast<int64_t>(rl.rlim_cur);
  return 0;
}
}  // namespace

bool blas_buffers_fit() {
  const int64_t limit = address_limit();
  return limit == 0 || limit - mapped_bytes() - kHeadroom >= 2 * kPerThread;
}

std::string HostMemoryPlan::summary() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "host memory: address-space limit %s, %s mapped, %d thread(s), %d OpenBLAS "
                "buffer(s) reserved, CPU allocator cap %s",
                address_limit ? format_bytes(address_limit).c_str() : "none",
                format_bytes(mapped).c_str(), threads, blas_buffers,
                cap ? format_bytes(cap).c_str() : "none");
  return buf;
}

HostMemoryPlan prepare_host_memory(double max_memory_gib) {
  HostMemoryPlan plan;
  plan.address_limit = address_limit();
  plan.threads = omp_get_max_threads();
  if (plan.address_limit > 0 && blas_memory_alloc != nullptr && blas_memory_free != nullptr) {
    // Start the OpenMP threads first: their stacks count against the limit too.
#pragma omp parallel
    { (void)omp_get_thread_num(); }
    const int64_t room = plan.address_limit - mapped_bytes() - kHeadroom;
    // One slot per thread plus the calling thread's.
    const int64_t fit = room > 0 ? room / kPerThread : 0;
    if (fit < 2)
      LT_THROW(ErrorKind::kOutOfMemory, "the address-space limit (ulimit -v) of ",
               format_bytes(plan.address_limit), " leaves ",
               format_bytes(std::max<int64_t>(room, 0)), " after start-up; OpenBLAS needs about ",
               format_bytes(kPerThread), " per thread to run: raise the limit");
    if (fit - 1 < plan.threads) {
      plan.threads = static_cast<int>(fit - 1);
      omp_set_num_threads(plan.threads);
      if (openblas_set_num_threads != nullptr) openblas_set_num_threads(plan.threads);
    }
    std::vector<void*> held(static_cast<size_t>(plan.threads) + 1, nullptr);
    held.back() = blas_memory_alloc(0);
#pragma omp parallel num_threads(plan.threads)
    { held[static_cast<size_t>(omp_get_thread_num())] = blas_memory_alloc(0); }
    for (void* p : held)
      if (p != nullptr) blas_memory_free(p);
    plan.blas_buffers = static_cast<int>(held.size());
  }
  plan.mapped = mapped_bytes();
  if (max_memory_gib > 0) {
    plan.cap = static_cast<int64_t>(max_memory_gib * 1024.0 * 1024.0 * 1024.0);
  } else if (plan.address_limit > 0) {
    // At least one byte: a cap of 0 would mean none, and nothing fits.
    plan.cap = std::max<int64_t>(1, (plan.address_limit - plan.mapped) / 10 * 8);
  }
  if (plan.cap > 0) allocator(Device::cpu()).set_memory_limit(static_cast<size_t>(plan.cap));
  return plan;
}

}  // namespace leantune
