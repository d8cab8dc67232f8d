// See checkpoint_checks.h.
#include "models/checkpoint_checks.h"

#include "engine/check.h"

namespace leantune {

void check_checkpoint_tensor(const std::string& name, const Tensor& src, const Shape& want) {
  LT_CHECK_INPUT(src.shape() == want, "tensor '", name, "' has shape ", shape_str(src.shape()),
                 " in the checkpoint, the config needs ", shape_str(want));
  LT_CHECK_INPUT(dtype_is_floating(src.dtype()), "tensor '", name, "' has dtype ",
                 dtype_name(src.dtype()), "; expected a float type");
}

void check_no_missing_tensors(const std::vector<std::string>& missing, const std::string& where) {
  if (missing.empty()) return;
  std::string list;
  for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
  if (missing.size() > 5) list += ", ...";
  LT_THROW(ErrorKind::kInput, where, " lacks ", missing.size(),
           " tensor(s) the model needs: ", list);
}

}  // namespace leantune
