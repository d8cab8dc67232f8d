// A 64-bit integer whose arithmetic refuses to overflow: +, -, * and / throw OverflowError
// (an Error of kind kInput) instead of wrapping around. For sizes computed
// from user options (the memory estimate's byte counts, a generation batch's bytes), where a
// wrapped value would be a negative or tiny size printed or trusted as real.
#pragma once

#include <cstdint>
#include <limits>

#include "engine/check.h"

namespace leantune {

// What CheckedInt throws: an Error(kInput) that callers may catch to name the options involved.
class OverflowError : public Error {
 public:
  using Error::Error;
};

class CheckedInt {
 public:
  constexpr CheckedInt(int64_t v = 0) : v_(v) {}  // NOLINT: implicit, as an int64_t
  constexpr int64_t get() const { return v_; }

  friend CheckedInt operator+(CheckedInt a, CheckedInt b) {
    int64_t r;
    if (__builtin_add_overflow(a.v_, b.v_, &r)) overflow();
    return r;
  }
  friend CheckedInt operator-(CheckedInt a, CheckedInt b) {
    int64_t r;
    if (__builtin_sub_overflow(a.v_, b.v_, &r)) overflow();
    return r;
  }
  friend CheckedInt operator*(CheckedInt a, CheckedInt b) {
    int64_t r;
    if (__builtin_mul_overflow(a.v_, b.v_, &r)) overflow();
    return r;
  }
  friend CheckedInt operator/(CheckedInt a, CheckedInt b) {
    LT_CHECK(b.v_ != 0, "CheckedInt: division by zero");
    if (a.v_ == std::numeric_limits<int64_t>::min() && b.v_ == -1) overflow();
    return a.v_ / b.v_;
  }
  CheckedInt operator-() const { return CheckedInt(0) - *this; }
  CheckedInt& operator+=(CheckedInt b) { return *this = *this + b; }
  CheckedInt& operator-=(CheckedInt b) { return *this = *this - b; }
  CheckedInt& operator*=(CheckedInt b) { return *this = *this * b; }
  friend auto operator<=>(CheckedInt a, CheckedInt b) = default;
  friend bool operator==(CheckedInt a, CheckedInt b) = default;

  [[noreturn]] static void overflow() {
    throw OverflowError(ErrorKind::kInput,
                        "a size computed from the options overflows 64-bit integers");
  }

 private:
  int64_t v_;
};

}  // namespace leantune
