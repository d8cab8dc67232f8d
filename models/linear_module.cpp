// LinearModule: the dense, quantized-base and adapter paths of a projection (see linear_module.h).
#include "models/linear_module.h"

#include <utility>

#include "kernels/linear.h"

namespace leantune {

Tensor LinearModule::forward(const Tensor& x) const {
  Tensor y = base ? base->forward(x, bias) : kernels::linear(x, weight, bias);
  return adapter ? adapter->forward(x, std::move(y)) : y;
}

Tensor LinearModule::dense_weight(DType dtype) const {
  if (base) return base->dequantize(dtype);
  return weight.dtype() == dtype ? weight : weight.to(dtype);
}

}  // namespace leantune
