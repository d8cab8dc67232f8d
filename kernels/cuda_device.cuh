// The device a CUDA entry point runs on: that of one named operand, which must be a CUDA device
// (the other operands are then checked against it with cu::check_on / cu::check_operand).
#pragma once

#include "engine/check.h"
#include "engine/tensor.h"

namespace leantune::kernels {

inline Device cuda_device_of(const Tensor& t, const char* op, const char* name) {
  LT_CHECK(t.device().is_cuda(), op, ": ", name, " ", t.str(), " is not on a CUDA device");
  return t.device();
}

}  // namespace leantune::kernels
