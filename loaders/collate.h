// Collation of rows (examples or packed bins) into one flat varlen Batch (loaders/batch.h),
// with TRL's DataCollatorForLanguageModeling semantics.
//
// A Row carries its tokens, a loss mask (label = token where 1, else -100) and, for a packed
// bin, the lengths of the sequences inside it (empty = the row is one sequence).
//
// Padding-free (padding_free = true):
//   Every sequence of every row is concatenated; cu_seqlens has one entry per sequence and
//   position_ids restart at 0 at each sequence start. Labels at position 0 are -100 (TRL:
//   labels[position_ids == 0] = -100), so no sequence predicts from the previous document.
//   pad_to_multiple_of = m: the total length is rounded up to a multiple of m with pad tokens
//   (pad_token_id, label -100, position 0 as TRL pads position_ids with 0). The pads form ONE
//   extra trailing sequence in cu_seqlens: real sequences keep their own ranges, so attention
//   over real tokens is unchanged, and the pad rows attend only among themselves. That extra
//   sequence is counted in cu_seqlens and max_seqlen but not in stats.sequences.
// Padded (padding_free = false):
//   Each row is ONE sequence padded on the right to the longest row of the batch, rounded up to
//   a multiple of pad_to_multiple_of: row b owns rows [b*P, (b+1)*P) of the flat layout, pads
//   are pad_token_id with label -100 and positions continue (arange(P), as a model without
//   position_ids computes them). Labels at a row's first position are kept as TRL does; the
//   causal shift never uses them. A row with several seq_lengths is treated as one sequence
//   (the data config forces padding-free for bfd packing, as TRL does).
// Stats: real_tokens, pad_tokens, sequences (real ones), label_tokens = labels != -100 at
//   positions that are not a sequence's first position (what reaches the loss after the shift).
//
// Preference batches (TRL DataCollatorForPreference): rows are [all chosen; all rejected], each
// prompt + completion cut to max_length by truncation_mode, padded (or padding-free); labels
// are the ids on completion tokens, -100 on the prompt and pads; completion_mask is returned
// per token too.
//
// API
//   Batch collate(std::span<const Row> rows, const CollateOptions& opts)
//   PreferenceBatch collate_preference(std::span<const PreferenceExample>,
//   PreferenceCollateOptions) BatchReport report(const Batch&, int64_t dropped_tokens)   efficiency
//   = real / total
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loaders/batch.h"
#include "loaders/data_config.h"
#include "loaders/examples.h"

namespace leantune {

struct Row {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> loss_mask;    // same length as input_ids; empty = all 1
  std::vector<int32_t> seq_lengths;  // sums to input_ids.size(); empty = one sequence
};

struct CollateOptions {
  bool padding_free = false;
  int64_t pad_to_multiple_of = 0;  // 0 = none
  int32_t pad_token_id = 0;
};

Batch collate(std::span<const Row> rows, const CollateOptions& opts);

struct PreferenceCollateOptions {
  int64_t max_length = 0;  // 0 = none
  TruncationMode truncation_mode = TruncationMode::kKeepStart;
  bool padding_free = false;
  int64_t pad_to_multiple_of = 0;
  int32_t pad_token_id = 0;
};

struct PreferenceBatch {
  Batch batch;             // 2 * pairs rows: chosen 0..n-1, then rejected 0..n-1
  Tensor completion_mask;  // [T] u8, 1 on completion tokens
  int64_t pairs = 0;
};

PreferenceBatch collate_preference(std::span<const PreferenceExample> pairs,
                                   const PreferenceCollateOptions& opts);

// What a training log shows for one micro-batch.
struct BatchReport {
  int64_t real_tokens = 0;
  int64_t pad_tokens = 0;
  int64_t dropped_tokens = 0;  // tokens of this batch's examples lost to truncation / bfd overflow
  int64_t label_tokens = 0;
  int64_t sequences = 0;
  double efficiency() const {  // real / total tokens of the batch
    const int64_t total = real_tokens + pad_tokens;
    return total > 0 ? static_cast<double>(real_tokens) / static_cast<double>(total) : 0.0;
  }
  std::string str() const;  // "tokens 4096 (real 4000, pad 96, dropped 0) efficiency 0.977"
};

BatchReport make_report(const Batch& batch, int64_t dropped_tokens);

}  // namespace leantune
