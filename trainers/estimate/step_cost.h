// What a change of options costs in step time, for trainer_bin estimate --budget_gib's ranking
// of the changes that fit: the FLOPs of one optimizer update per rank by the count the training
// log's MFU uses (engine/device_peaks.h: 4 N + 2 N_trainable per token; gradient checkpointing
// adds a forward, 2 N), and by name the costs that count leaves out (host transfers,
// dequantization, smaller GEMMs), since leantune has no measured factor for them yet.
#pragma once

#include <string>
#include <vector>

#include "trainers/estimate/estimate.h"

namespace leantune {

inline constexpr const char* kStepCostModel =
    "6N per token, 8N with gradient checkpointing, 4N + 2N_trainable under LoRA";

struct StepCost {
  double flops = 0;                     // one optimizer update on one rank
  std::vector<std::string> unmodelled;  // costs `c` adds over `base` that flops leaves out
};

// c: the options of a variant with its estimate e; base: the options given.
StepCost step_cost(const EstimateConfig& c, const MemoryEstimate& e, const EstimateConfig& base);

}  // namespace leantune
