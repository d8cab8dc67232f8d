// trainer_bin distill's divergence of one packed micro-batch (trainers/online/distill.cpp): the
// student's and the frozen teacher's hidden states over the batch, and
// kernels::linear_divergence on the rows whose next token is a completion token (labels not
// -100, shifted as the LM loss shifts them), as TRL 1.16's DistillationTrainer._compute_loss.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "loaders/batch.h"
#include "models/decoder.h"

namespace leantune {

struct DistillOptions {
  double beta = 1.0;  // 0 forward KL, 1 reverse KL, between: the generalized JSD
  double temperature = 1.0;
  int64_t chunk_tokens = 1024;
  bool gradient_checkpointing = false;
};

struct DistillDivergence {
  Tensor divergence;  // [T] f32, 0 on rows that do not count; differentiable (student only)
  std::vector<int64_t> mask;
  double sum = 0;          // the divergence over the counted rows
  double entropy_sum = 0;  // the student's entropy over them (nats)
  double tokens = 0;       // rows counted
};

DistillDivergence distill_divergence(const DecoderModel& student, const DecoderModel& teacher,
                                     const Batch& b, const DistillOptions& opt);

}  // namespace leantune
