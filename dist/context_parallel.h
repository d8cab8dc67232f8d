// Context parallelism (--cp_size): the ranks of a cp group share every micro-batch and split its
// sequence dimension in the zigzag layout of kernels/ring_attention.h; attention is the ring over
// the cp group, every other layer is row-local.
//
// Process groups, from the world communicator (world = dp x cp):
//   cp group: color = rank / cp, key = rank % cp   (consecutive ranks share a micro-batch)
//   dp group: color = rank % cp, key = rank / cp   (data sharding: dp size and rank)
// Gradients and the loss token count are still summed over the WORLD (each rank holds partial
// gradients of its rows), so the trainer's data-parallel reductions need no change.
//
// The batch split (split_context_parallel): the global micro-batch (loaders/batch.h) is shifted
// first (targets[t] = labels[t+1] inside a sequence), then every sequence is padded at its end to
// a multiple of 2cp (ids = pad id, target -100, positions continuing) and this rank's rows are
// taken: chunks r and 2cp-1-r of every sequence. The local batch carries the targets as its
// labels (ForwardOptions::labels_shifted), the global positions (RoPE) and the local cu_seqlens.
// Each real target token lands on exactly one rank, so the local counts sum to the global one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/comm.h"
#include "loaders/batch.h"
#include "models/decoder.h"
#include "models/ref_model.h"

namespace leantune {

struct ContextParallelGroups {
  int cp_size = 1;
  int cp_rank = 0;
  int dp_size = 1;  // data shards
  int dp_rank = 0;
  std::unique_ptr<Communicator> cp;  // the ranks sharing a micro-batch; null when cp_size is 1
  std::unique_ptr<Communicator> dp;  // null when cp_size is 1 (the world is the dp group)
};

// Error(kInput) naming option cp_size when the world size is not a multiple of cp_size.
// Collective over `world` when cp_size > 1 (split).
ContextParallelGroups make_context_parallel_groups(Communicator& world, int cp_size);

// The pad_to_multiple_of a context-parallel run uses: 2cp when the user gave none; a user value
// that is not a multiple of 2cp is an Error(kInput) naming the option. (0 = none when cp is 1.)
int64_t context_parallel_pad_multiple(int cp_size, int64_t user_value);

struct ContextParallelBatch {
  Batch local;  // labels = shifted targets; stats.label_tokens = this rank's target tokens
  std::shared_ptr<const ContextParallel> context;
};

// Rank cp_rank's zigzag rows of `global` (host tensors) among cp_size ranks; the context's ring
// runs over `comm` (the cp group: size cp_size, rank cp_rank; null only where nothing runs the
// model, e.g. tests of the split).
ContextParallelBatch split_context_parallel(const Batch& global, int cp_size, int cp_rank,
                                            int64_t pad_token_id, Communicator* comm);

// The loss tokens of this rank's rows (split_context_parallel's label_tokens, without building
// the batch).
int64_t context_parallel_label_tokens(const Batch& global, int cp_size, int cp_rank);

// The groups a trainer splits its micro-batches over (Trainer::set_context_parallel), made from
// `world` (null: the world communicator of `comm`): Error(kInput) naming option cp_size when
// `model` cannot run the ring (the CPU ring takes f32; on CUDA it takes f32, bf16 or f16 over the
// nccl backend), then make_context_parallel_groups. Collective when cp_size > 1.
std::shared_ptr<ContextParallelGroups> context_parallel_for(const DecoderModel& model, int cp_size,
                                                            const CommOptions& comm,
                                                            Communicator* world = nullptr);

// The sum of `x` over the cp group, differentiable. Each rank's x is a partial sum over its own
// rows (e.g. per-sequence log-probabilities), and every rank then computes the same loss from
// the full sums; the gradient passes through unchanged, since d(full)/d(partial) is 1 and each
// partial depends only on its rank's rows (the world-wide gradient sum adds the ranks' parts).
Tensor cp_sum(const Tensor& x, Communicator& comm);

// One micro-batch as this rank scores it: without context parallelism (groups null or cp_size 1)
// the whole batch; with it, this rank's zigzag rows through the ring, the per-sequence values
// summed over the cp group, so every rank holds the whole sequences' values (the trainers that
// score sequences: dpo, kto).
class CpScoring {
 public:
  CpScoring(const Batch& global, const ContextParallelGroups* groups, int64_t pad_token_id);
  // sequence_logps with the full per-sequence values (logps differentiable through cp_sum).
  kernels::SequenceLogprobs policy(const DecoderModel& model, SequenceLogpsOptions opts) const;
  // The reference's full per-sequence log-probabilities (keys: the sequences' cache keys) for
  // the policy `model` (whose dtype and device the sums take); a precomputed reference's cached
  // values are whole already.
  std::vector<double> reference(ReferenceModel& ref, const std::vector<int64_t>& keys,
                                const SequenceLogpsOptions& opts, const DecoderModel& model) const;

 private:
  const Batch& global_;
  std::optional<ContextParallelBatch> split_;
  Communicator* cp_ = nullptr;
};

// Host per-sequence partial sums (a reference's log-probabilities) summed over the cp group as
// cp_sum sums the policy's: through a tensor of sequence_logps' dtype for `model` (f64 for f64
// models, else f32) on its device (NCCL moves device tensors), so that equal models give equal
// full values, as in one process.
std::vector<double> cp_sum_values(const std::vector<double>& partial, const DecoderModel& model,
                                  Communicator& comm);

// The host-side per-sequence partial sums of `s` (tokens, logit_sums, entropy_sums,
// top1_counts; s.logps is left alone, see cp_sum) summed over the cp group: every rank ends
// with the full sequences' values.
void cp_sum_sequence_stats(kernels::SequenceLogprobs& s, Communicator& comm);

}  // namespace leantune
