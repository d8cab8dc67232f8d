// The activation-offloading options and the per-micro-batch offloader (see offload_options.h).
#include "trainers/common/offload_options.h"

namespace leantune {

void add_offload_options(Options& o) {
  const OffloadArguments d;
  o.add_bool("activation_offloading", d.activation_offloading,
             "move saved activations to pinned host memory in forward, back in backward "
             "(with gradient_checkpointing only the layer inputs move)");
  o.add_int("min_offload_size", d.min_offload_size,
            "saved tensors under this many bytes stay on the device (leantune option; TRL fixes "
            "1024)",
            0);
}

OffloadArguments offload_arguments(const Options& o) {
  OffloadArguments a;
  a.activation_offloading = o.get_bool("activation_offloading");
  a.min_offload_size = o.get_int("min_offload_size");
  return a;
}

std::unique_ptr<ActivationOffloader> make_step_offloader(const OffloadArguments& a, Device device) {
  if (!a.activation_offloading) return nullptr;
  OffloadOptions opt;
  opt.device = device;
  opt.min_offload_size = a.min_offload_size;
  return std::make_unique<ActivationOffloader>(opt);
}

}  // namespace leantune
