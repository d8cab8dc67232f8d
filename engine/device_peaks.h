// The dense 16-bit (bf16/f16) tensor-core peak of a GPU, from its name as CUDA reports it
// (cudaDeviceProp::name): the denominator of the training log's MFU. The figures are the
// vendor datasheets' dense rates (the "with sparsity" figures halved); a GPU that is not in the
// table, or whose variant the name does not pin down (the NVL parts), gives 0 and no MFU is
// printed rather than one against a guessed peak.
#pragma once

#include <string>

namespace leantune {

// FLOP/s; 0 when unknown.
double peak_bf16_flops(const std::string& device_name);

// Model FLOPs of one token's training step: forward 2 N, input gradients 2 N, weight gradients
// 2 per trainable parameter (6 N for full fine-tuning, as in PaLM's MFU; less with LoRA or a
// frozen base). Attention's own FLOPs and recomputation are not counted: MFU, not HFU, and a
// lower bound at long context.
double training_flops_per_token(double parameters, double trainable_parameters);

}  // namespace leantune
