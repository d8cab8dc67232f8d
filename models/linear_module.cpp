#include "models/linear_module.h"

#include "kernels/linear.h"

namespace leantune {

Tensor LinearModule::forward(const Tensor& x) const { return kernels::linear(x, weight, bias); }

}  // namespace leantune
