// Element types. Compute happens in f32/f64/bf16/f16; the integer types carry ids, masks and
// quantized weights; the remaining safetensors types are known so files holding them can be
// validated and inspected.
//
// bf16 and f16 conversions round to nearest, ties to even. NaN stays NaN (quiet, sign kept),
// infinities stay infinite, overflow rounds to infinity, and subnormals are produced and read.
// The conversions are header-only and usable from CUDA device code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#if defined(__CUDACC__)
#define LT_HD __host__ __device__ __forceinline__
#else
#define LT_HD inline
#endif

namespace leantune {

enum class DType : uint8_t {
  kF32,
  kF64,
  kBF16,
  kF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kU16,
  kU32,
  kU64,
  kBool,
  kF8E4M3,
  kF8E5M2,
};
constexpr int kNumDTypes = 15;

size_t dtype_size(DType t);
// Short name used in messages and reports: "f32", "bf16", ...
const char* dtype_name(DType t);
// The name the safetensors format uses: "F32", "BF16", ...
const char* dtype_safetensors_name(DType t);
// Parses a safetensors dtype name; returns false when it is not a known name.
bool dtype_from_safetensors_name(std::string_view name, DType* out);
// Parses "f32"/"float32"/"bf16"/"bfloat16"/"f16"/"float16"/"fp16"/... ; false when unknown.
bool dtype_from_string(std::string_view name, DType* out);
bool dtype_is_floating(DType t);

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

LT_HD uint16_t bf16_from_bits32(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

LT_HD uint16_t f16_from_bits32(uint32_t x) {
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (ax < 0x38800000u) {                                               // below 2^-14
    if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);          // <= 2^-25: zero
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = ax - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

LT_HD uint32_t bits32_from_f16(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return sign | 0x7f800000u | (m << 13);
  if (e == 0) {
    if (m == 0) return sign;
    // Subnormal: normalise.
    e = 113;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    m &= 0x3ffu;
    return sign | (e << 23) | (m << 13);
  }
  return sign | ((e + 112u) << 23) | (m << 13);
}

// Host-side value conversions.
inline uint16_t f32_to_bf16(float f) { return bf16_from_bits32(f32_bits(f)); }
inline float bf16_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }
inline uint16_t f32_to_f16(float f) { return f16_from_bits32(f32_bits(f)); }
inline float f16_to_f32(uint16_t h) { return f32_from_bits(bits32_from_f16(h)); }

// Storage types for 16-bit floats on the host (distinct types for overloads and templates).
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};
inline float to_f32(bf16_t v) { return bf16_to_f32(v.bits); }
inline float to_f32(f16_t v) { return f16_to_f32(v.bits); }

// The type float arithmetic on elements of type T runs in, on the host and on the device: double
// for double, float for f32 and for every 16-bit float storage type.
template <typename T>
using float_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// DTypeOf<T>::value: the DType of host element type T (undefined for other types, so a wrong
// element type fails to compile).
template <typename T>
struct DTypeOf;
#define LT_DEFINE_DTYPE_OF(type, enum_value)          \
  template <>                                         \
  struct DTypeOf<type> {                              \
    static constexpr DType value = DType::enum_value; \
  }
LT_DEFINE_DTYPE_OF(float, kF32);
LT_DEFINE_DTYPE_OF(double, kF64);
LT_DEFINE_DTYPE_OF(bf16_t, kBF16);
LT_DEFINE_DTYPE_OF(f16_t, kF16);
LT_DEFINE_DTYPE_OF(int64_t, kI64);
LT_DEFINE_DTYPE_OF(int32_t, kI32);
LT_DEFINE_DTYPE_OF(int16_t, kI16);
LT_DEFINE_DTYPE_OF(int8_t, kI8);
LT_DEFINE_DTYPE_OF(uint8_t, kU8);
LT_DEFINE_DTYPE_OF(bool, kBool);
#undef LT_DEFINE_DTYPE_OF

}  // namespace leantune

// One case of a dtype switch: binds T to `type` for the statements in the remaining arguments.
// The dispatch macros of engine/cpu_kernels.h and engine/cuda_utils.cuh are built from it.
#define LT_DTYPE_CASE(enum_value, T, type, ...) \
  case ::leantune::DType::enum_value: {         \
    using T = type;                             \
    __VA_ARGS__;                                \
    break;                                      \
  }

// The four floating cases of a dtype switch, binding T to float, double and the given 16-bit
// storage types (the host's bf16_t/f16_t, or CUDA's __nv_bfloat16/__half).
#define LT_FLOAT_DTYPE_CASES(T, bf16_type, f16_type, ...) \
  LT_DTYPE_CASE(kF32, T, float, __VA_ARGS__)              \
  LT_DTYPE_CASE(kF64, T, double, __VA_ARGS__)             \
  LT_DTYPE_CASE(kBF16, T, bf16_type, __VA_ARGS__)         \
  LT_DTYPE_CASE(kF16, T, f16_type, __VA_ARGS__)
