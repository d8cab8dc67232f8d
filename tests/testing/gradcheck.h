// Central finite differences in float64 against autograd.
//
// f maps the inputs to one or more outputs. The check contracts the outputs with fixed random
// weights w_k, L = sum_k <out_k, w_k>, and compares dL/dx from backward() with
// (L(x + eps) - L(x - eps)) / (2 eps) for every element (or a fixed random sample of
// `max_elements` per input). Inputs must be f64; integer inputs are passed through unchecked.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "engine/tensor.h"

namespace leantune::testing {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-5;
  int64_t max_elements = 400;  // per input
  uint64_t seed = 1234;
};

using GradFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

::testing::AssertionResult gradcheck(const GradFn& f, const std::vector<Tensor>& inputs,
                                     const GradcheckOptions& opt = {});

}  // namespace leantune::testing
