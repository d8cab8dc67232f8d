// Shared timing for the CUDA benchmarks: CUDA events around each call on the current stream of
// cuda:0, warm-up calls first, the median of the timed calls; the peak device memory a call adds;
// seeded bf16 inputs; the --reps option; the JSON report gpu_suite.sh merges.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/device.h"
#include "engine/rng.h"
#include "engine/stream.h"
#include "engine/tensor.h"

namespace leantune::bench {

inline cudaStream_t gpu_stream() {
  return static_cast<cudaStream_t>(current_stream(Device::cuda(0)).handle);
}

// Median milliseconds of `reps` calls of fn after `warmup` untimed ones.
inline double median_ms(const std::function<void()>& fn, int reps, int warmup) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, gpu_stream()));
    fn();
    CUDA_CHECK(cudaEventRecord(b, gpu_stream()));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0.0 : ms[ms.size() / 2];
}

// Peak allocated bytes of cuda:0 above what is allocated now, while fn runs once.
inline int64_t peak_extra_bytes(const std::function<void()>& fn) {
  Allocator& alloc = allocator(Device::cuda(0));
  device_synchronize(Device::cuda(0));
  const int64_t base = alloc.stats().allocated.current;
  alloc.reset_peak_stats();
  fn();
  device_synchronize(Device::cuda(0));
  return alloc.stats().allocated.peak - base;
}

// A bf16 tensor on cuda:0 of normal(0, std) values, from the test stream of `seed`.
inline Tensor bf16_randn(const Shape& s, uint64_t seed, double std) {
  Tensor t = Tensor::empty(s, DType::kBF16, Device::cuda(0));
  Generator g(seed, RngPurpose::kTest);
  normal_(t, g, 0.0, std);
  return t;
}

// The value of --reps N on the command line, else `reps` (at least 1).
inline int reps_option(int argc, char** argv, int reps) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
  return reps;
}

// A failed benchmark case: its error under `key`, and the launch error state cleared so that the
// next case starts clean.
inline void record_failure(nlohmann::json& errors, const std::string& key,
                           const std::exception& e) {
  errors[key] = e.what();
  cudaGetLastError();
}

// Prints {"figures", "errors"} (what gpu_suite.sh merges) and returns the exit status.
inline int print_report(const nlohmann::json& figures, const nlohmann::json& errors) {
  nlohmann::json out;
  out["figures"] = figures;
  out["errors"] = errors;
  std::printf("%s\n", out.dump(1).c_str());
  return errors.empty() ? 0 : 1;
}

}  // namespace leantune::bench
