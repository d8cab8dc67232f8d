// Names of an enum's values, for messages, reports and option values. Each enum keeps one table
// of names in the order of its values (0, 1, 2, ...); the same table turns a value into its name
// and a name back into its value, so that what is printed is what is parsed. enum_lookup reads
// tables of other values (the matching constants of CUDA or NCCL) alike. Beside each table a
// static_assert ties its length to the enum's last value, so that a new value cannot go unnamed.
#pragma once

#include <cstddef>
#include <iterator>  // std::size, for the static_asserts beside the tables
#include <string_view>

namespace leantune {

// table[value], or `fallback` for a value outside the table. Tables of other things than names
// (a library's constant for each value) are read the same way.
template <typename E, typename T, size_t N>
constexpr T enum_lookup(E value, const T (&table)[N], T fallback) {
  const auto i = static_cast<size_t>(value);
  return i < N ? table[i] : fallback;
}

// names[value], or `fallback` for a value outside the table.
template <typename E, size_t N>
constexpr const char* enum_name(E value, const char* const (&names)[N], const char* fallback) {
  return enum_lookup<E, const char*, N>(value, names, fallback);
}

// The value named `name`; false (and *out untouched) when no value has that name.
template <typename E, size_t N>
constexpr bool enum_from_name(std::string_view name, const char* const (&names)[N], E* out) {
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i]) {
      *out = static_cast<E>(i);
      return true;
    }
  }
  return false;
}

}  // namespace leantune
