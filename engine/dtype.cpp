// Element types: names, sizes and parsing (see dtype.h).
#include "engine/dtype.h"

#include "engine/check.h"

namespace leantune {
namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  const char* name;
  const char* st_name;
  bool floating;
};
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {DType::kF32, 4, "f32", "F32", true},
    {DType::kF64, 8, "f64", "F64", true},
    {DType::kBF16, 2, "bf16", "BF16", true},
    {DType::kF16, 2, "f16", "F16", true},
    {DType::kI64, 8, "i64", "I64", false},
    {DType::kI32, 4, "i32", "I32", false},
    {DType::kI16, 2, "i16", "I16", false},
    {DType::kI8, 1, "i8", "I8", false},
    {DType::kU8, 1, "u8", "U8", false},
    {DType::kU16, 2, "u16", "U16", false},
    {DType::kU32, 4, "u32", "U32", false},
    {DType::kU64, 8, "u64", "U64", false},
    {DType::kBool, 1, "bool", "BOOL", false},
    {DType::kF8E4M3, 1, "f8e4m3", "F8_E4M3", true},
    {DType::kF8E5M2, 1, "f8e5m2", "F8_E5M2", true},
};
const DTypeInfo& info(DType t) {
  auto i = static_cast<size_t>(t);
  LT_CHECK(i < kNumDTypes, "bad dtype ", i);
  return kInfo[i];
}
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
const char* dtype_name(DType t) { return info(t).name; }
const char* dtype_safetensors_name(DType t) { return info(t).st_name; }
bool dtype_is_floating(DType t) { return info(t).floating; }

bool dtype_from_safetensors_name(std::string_view name, DType* out) {
  for (const auto& i : kInfo) {
    if (name == i.st_name) {
      *out = i.type;
      return true;
    }
  }
  return false;
}

bool dtype_from_string(std::string_view s, DType* out) {
  struct Alias {
    const char* name;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::kF32},   {"float32", DType::kF32},   {"fp32", DType::kF32},
      {"float", DType::kF32}, {"f64", DType::kF64},       {"float64", DType::kF64},
      {"bf16", DType::kBF16}, {"bfloat16", DType::kBF16}, {"f16", DType::kF16},
      {"fp16", DType::kF16},  {"float16", DType::kF16},   {"half", DType::kF16},
      {"i64", DType::kI64},   {"int64", DType::kI64},     {"i32", DType::kI32},
      {"int32", DType::kI32}, {"i8", DType::kI8},         {"int8", DType::kI8},
      {"u8", DType::kU8},     {"uint8", DType::kU8},
  };
  for (const auto& a : kAliases) {
    if (s == a.name) {
      *out = a.type;
      return true;
    }
  }
  return dtype_from_safetensors_name(s, out);
}

}  // namespace leantune
