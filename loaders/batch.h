// A training batch, flat and variable-length (docs/architecture.md, decision 5 "Varlen inside").
//   input_ids:[T] i64, position_ids:[T] i64, labels:[T] i64 (-100 = no loss), cu_seqlens:[B+1]
//   i32. Sequence b owns rows [cu_seqlens[b], cu_seqlens[b+1]). Labels are aligned with
//   input_ids as in TRL (the model shifts them: position t predicts labels[t+1] of the same
//   sequence). Padded batches are also expressed this way: pad rows are real rows with
//   pad_token_id and label -100 that belong to their sequence's row range.
// All tensors live on the host; the trainer moves them to the device.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace leantune {

struct BatchStats {
  int64_t real_tokens = 0;   // tokens of real data
  int64_t pad_tokens = 0;    // padding added (pad_to_multiple_of, padded batches)
  int64_t label_tokens = 0;  // positions that contribute to the loss (after the shift)
  int64_t sequences = 0;
};

struct Batch {
  Tensor input_ids;
  Tensor position_ids;
  Tensor labels;
  Tensor cu_seqlens;
  int64_t max_seqlen = 0;
  BatchStats stats;
  int64_t num_tokens() const { return input_ids.defined() ? input_ids.numel() : 0; }
};

}  // namespace leantune
