// Helpers for CPU implementations: dtype dispatch, load/store through the accumulation type,
// and OpenMP parallel loops. Float types compute in `acc_t<T>`: float for f32/bf16/f16, double
// for f64, so float64 references and gradchecks run exactly in double.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "engine/check.h"
#include "engine/dtype.h"

namespace leantune::cpu {

template <typename T>
using acc_t = float_acc_t<T>;

inline float load(const float* p, int64_t i) { return p[i]; }
inline double load(const double* p, int64_t i) { return p[i]; }
inline float load(const bf16_t* p, int64_t i) { return bf16_to_f32(p[i].bits); }
inline float load(const f16_t* p, int64_t i) { return f16_to_f32(p[i].bits); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(double* p, int64_t i, double v) { p[i] = v; }
inline void store(bf16_t* p, int64_t i, float v) { p[i].bits = f32_to_bf16(v); }
inline void store(f16_t* p, int64_t i, float v) { p[i].bits = f32_to_f16(v); }

// Generic value conversion for copies between any numeric types.
template <typename T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return bf16_to_f32(v.bits);
  else if constexpr (std::is_same_v<T, f16_t>)
    return f16_to_f32(v.bits);
  else
    return static_cast<double>(v);
}
template <typename T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return bf16_t{f32_to_bf16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, f16_t>)
    return f16_t{f32_to_f16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0.0;
  else
    return static_cast<T>(v);
}

// Loop items below which a parallel_for stays serial: about 32K elements of work in all, since
// a parallel region costs more than that saves on the two shared cores the CPU path targets.
inline int64_t grain_for(int64_t elems_per_item) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(elems_per_item, 1));
}

// Parallel loop over [0, n) in chunks; runs inline when n is small.
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= grain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace leantune::cpu

// Dispatch over floating dtypes: binds T to float, double, bf16_t or f16_t.
#define LT_DISPATCH_FLOAT(dtype, T, ...)                                        \
  switch (dtype) {                                                              \
    LT_FLOAT_DTYPE_CASES(T, ::leantune::bf16_t, ::leantune::f16_t, __VA_ARGS__) \
    default:                                                                    \
      LT_THROW(::leantune::ErrorKind::kInternal, "unsupported dtype ",          \
               ::leantune::dtype_name(dtype), " (expected a floating type)");   \
  }

// Dispatch over every numeric dtype copies can convert between.
#define LT_DISPATCH_ALL(dtype, T, ...)                                          \
  switch (dtype) {                                                              \
    LT_FLOAT_DTYPE_CASES(T, ::leantune::bf16_t, ::leantune::f16_t, __VA_ARGS__) \
    LT_DTYPE_CASE(kI64, T, int64_t, __VA_ARGS__)                                \
    LT_DTYPE_CASE(kI32, T, int32_t, __VA_ARGS__)                                \
    LT_DTYPE_CASE(kI16, T, int16_t, __VA_ARGS__)                                \
    LT_DTYPE_CASE(kI8, T, int8_t, __VA_ARGS__)                                  \
    LT_DTYPE_CASE(kU8, T, uint8_t, __VA_ARGS__)                                 \
    LT_DTYPE_CASE(kU16, T, uint16_t, __VA_ARGS__)                               \
    LT_DTYPE_CASE(kU32, T, uint32_t, __VA_ARGS__)                               \
    LT_DTYPE_CASE(kU64, T, uint64_t, __VA_ARGS__)                               \
    LT_DTYPE_CASE(kBool, T, bool, __VA_ARGS__)                                  \
    default:                                                                    \
      LT_THROW(::leantune::ErrorKind::kInternal, "unsupported dtype ",          \
               ::leantune::dtype_name(dtype), " for conversion");               \
  }
