// A flat varlen Batch (loaders/batch.h) on the host from its columns, for the collators that
// build sequences row by row (preference pairs, unpaired examples, rollouts, scored sequences):
//   ids, pos, labels: [T] i64 (labels -100 where not scored); cu: [B+1] i32 sequence offsets;
//   max_seqlen: the longest sequence; stats: the collator's counts, copied as they are.
#pragma once

#include <cstdint>
#include <vector>

#include "loaders/batch.h"

namespace leantune {

Batch host_batch(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos,
                 const std::vector<int64_t>& labels, const std::vector<int32_t>& cu,
                 int64_t max_seqlen, const BatchStats& stats);

}  // namespace leantune
