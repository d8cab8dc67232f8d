// The activation-offloading options of every trainer, and the offloader of one micro-batch.
//
//   activation_offloading  TRL's option (SFTConfig.activation_offloading): saved activations
//                          move to pinned host memory during forward and come back during
//                          backward (engine/offload.h).
//   min_offload_size       leantune's own option: TRL hard-codes 1024 bytes in
//                          OffloadActivations; saved tensors smaller than this stay on the device.
//
// The trainer creates one offloader per micro-batch around forward AND backward (TRL enters its
// context manager in training_step), and destroys it right after backward, before the next
// micro-batch and before the optimizer step:
//
//   for each micro-batch:
//     std::unique_ptr<ActivationOffloader> off = make_step_offloader(offload_args, device);
//     Tensor loss = compute_loss(...);
//     ...
//     loss.backward();
//     off.reset();  // waits for copies in flight, drops the stash
#pragma once

#include <cstdint>
#include <memory>

#include "engine/device.h"
#include "engine/offload.h"
#include "loaders/option_table.h"

namespace leantune {

struct OffloadArguments {
  bool activation_offloading = false;
  int64_t min_offload_size = 1024;
};

// activation_offloading and min_offload_size (part of the training table).
const OptionTable<OffloadArguments>& offload_table();

// The offloader for one micro-batch on `device`, or nullptr when offloading is off.
std::unique_ptr<ActivationOffloader> make_step_offloader(const OffloadArguments& a, Device device);

}  // namespace leantune
