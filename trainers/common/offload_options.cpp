// The activation-offloading options and the per-micro-batch offloader (see offload_options.h).
#include "trainers/common/offload_options.h"

namespace leantune {

const OptionTable<OffloadArguments>& offload_table() {
  using A = OffloadArguments;
  static const OptionTable<A> t =
      OptionTable<A>()
          .flag("activation_offloading", &A::activation_offloading,
                "move saved activations to pinned host memory in forward, back in backward "
                "(with gradient_checkpointing only the layer inputs move)")
          .integer("min_offload_size", &A::min_offload_size,
                   "saved tensors under this many bytes stay on the device (leantune option; TRL "
                   "fixes 1024)",
                   0);
  return t;
}

std::unique_ptr<ActivationOffloader> make_step_offloader(const OffloadArguments& a, Device device) {
  if (!a.activation_offloading) return nullptr;
  OffloadOptions opt;
  opt.device = device;
  opt.min_offload_size = a.min_offload_size;
  return std::make_unique<ActivationOffloader>(opt);
}

}  // namespace leantune
