// The checks every model loader makes of a Hugging Face checkpoint (DecoderModel::load,
// load_quantized, load_offloaded), so that each names a bad tensor the same way.
//   check_checkpoint_tensor: the tensor's shape is the one the config needs and its dtype a
//     float type, else Error(kInput) naming it.
//   check_no_missing_tensors: Error(kInput) "<where> lacks N tensor(s) the model needs: ..."
//     naming the first five, when `missing` is not empty.
#pragma once

#include <string>
#include <vector>

#include "engine/tensor.h"

namespace leantune {

void check_checkpoint_tensor(const std::string& name, const Tensor& src, const Shape& want);
void check_no_missing_tensors(const std::vector<std::string>& missing, const std::string& where);

}  // namespace leantune
