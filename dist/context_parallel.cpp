// Context-parallel groups and the zigzag batch split (see context_parallel.h).
#include "dist/context_parallel.h"

#include <algorithm>
#include <vector>

#include "engine/autograd.h"
#include "engine/check.h"
#include "engine/offload.h"
#include "kernels/cross_entropy.h"
#include "kernels/ring_attention.h"

namespace leantune {

ContextParallelGroups make_context_parallel_groups(Communicator& world, int cp_size) {
  LT_CHECK_INPUT(cp_size >= 1 && world.size() % cp_size == 0, "option cp_size ", cp_size,
                 ": the world size ", world.size(), " must be a multiple of it");
  ContextParallelGroups g;
  g.cp_size = cp_size;
  g.cp_rank = world.rank() % cp_size;
  g.dp_size = world.size() / cp_size;
  g.dp_rank = world.rank() / cp_size;
  if (cp_size == 1) return g;
  g.cp = world.split(g.dp_rank, g.cp_rank);
  g.dp = world.split(g.cp_rank, g.dp_rank);
  LT_CHECK(g.cp->size() == cp_size && g.cp->rank() == g.cp_rank && g.dp->size() == g.dp_size &&
               g.dp->rank() == g.dp_rank,
           "context-parallel groups: split gave cp ", g.cp->rank(), "/", g.cp->size(), ", dp ",
           g.dp->rank(), "/", g.dp->size());
  return g;
}

int64_t context_parallel_pad_multiple(int cp_size, int64_t user_value) {
  if (cp_size == 1) return user_value;
  const int64_t m = 2 * static_cast<int64_t>(cp_size);
  LT_CHECK_INPUT(user_value == 0 || user_value % m == 0, "option pad_to_multiple_of ", user_value,
                 ": must be a multiple of 2 x cp_size = ", m,
                 " (every sequence is split into 2 x cp_size chunks)");
  return user_value == 0 ? m : user_value;
}

namespace {

std::vector<int64_t> sequence_lengths(const std::vector<int64_t>& cu) {
  std::vector<int64_t> lengths;
  for (size_t i = 1; i < cu.size(); ++i) lengths.push_back(cu[i] - cu[i - 1]);
  return lengths;
}

}  // namespace

ContextParallelBatch split_context_parallel(const Batch& global, int cp_size, int cp_rank,
                                            int64_t pad_token_id, Communicator* comm) {
  LT_CHECK(global.input_ids.defined() && global.labels.defined() && global.cu_seqlens.defined(),
           "split_context_parallel: a batch without ids, labels or cu_seqlens");
  const std::vector<int64_t> cu = global.cu_seqlens.to_i64();
  const std::vector<int64_t> ids = global.input_ids.to_i64();
  const std::vector<int64_t> pos = global.position_ids.to_i64();
  const std::vector<int64_t> targets =
      kernels::shift_labels(global.labels, global.cu_seqlens).to_i64();
  auto ctx = std::make_shared<ContextParallel>();
  LT_CHECK(!comm || (comm->size() == cp_size && comm->rank() == cp_rank),
           "split_context_parallel: rank ", cp_rank, " of ", cp_size, " over a communicator of ",
           comm ? comm->size() : 0, " ranks");
  ctx->comm = comm;
  ctx->layout = kernels::zigzag_layout(sequence_lengths(cu), cp_size, cp_rank);
  const kernels::ZigzagLayout& z = ctx->layout;

  const int64_t n = z.local_rows();
  std::vector<int64_t> l_ids(n), l_pos(n), l_tgt(n);
  int64_t label_tokens = 0, real = 0, max_local = 0;
  for (size_t d = 0; d + 1 < z.cu_seqlens_local.size(); ++d) {
    max_local = std::max<int64_t>(max_local, z.cu_seqlens_local[d + 1] - z.cu_seqlens_local[d]);
    for (int64_t j = z.cu_seqlens_local[d]; j < z.cu_seqlens_local[d + 1]; ++j) {
      const int64_t p = z.positions[j];
      if (p < z.lengths[d]) {
        const int64_t g = cu[d] + p;
        l_ids[j] = ids[g];
        l_pos[j] = pos[g];
        l_tgt[j] = targets[g];
        ++real;
      } else {
        l_ids[j] = pad_token_id;
        l_pos[j] = p;
        l_tgt[j] = kernels::kIgnoreIndex;
      }
      label_tokens += l_tgt[j] != kernels::kIgnoreIndex;
    }
  }
  ContextParallelBatch out;
  Batch& b = out.local;
  b.input_ids = Tensor::from_vector(l_ids, {n});
  b.position_ids = Tensor::from_vector(l_pos, {n});
  b.labels = Tensor::from_vector(l_tgt, {n});
  b.cu_seqlens =
      Tensor::from_vector(z.cu_seqlens_local, {static_cast<int64_t>(z.cu_seqlens_local.size())});
  b.max_seqlen = max_local;
  b.stats.real_tokens = real;
  b.stats.pad_tokens = n - real;
  b.stats.label_tokens = label_tokens;
  b.stats.sequences = global.stats.sequences;
  out.context = std::move(ctx);
  return out;
}

int64_t context_parallel_label_tokens(const Batch& global, int cp_size, int cp_rank) {
  const std::vector<int64_t> cu = global.cu_seqlens.to_i64();
  const std::vector<int64_t> targets =
      kernels::shift_labels(global.labels, global.cu_seqlens).to_i64();
  const kernels::ZigzagLayout z = kernels::zigzag_layout(sequence_lengths(cu), cp_size, cp_rank);
  int64_t n = 0;
  for (size_t d = 0; d + 1 < z.cu_seqlens_local.size(); ++d)
    for (int64_t j = z.cu_seqlens_local[d]; j < z.cu_seqlens_local[d + 1]; ++j)
      if (z.positions[j] < z.lengths[d])
        n += targets[cu[d] + z.positions[j]] != kernels::kIgnoreIndex;
  return n;
}

std::shared_ptr<ContextParallelGroups> context_parallel_for(const DecoderModel& model, int cp_size,
                                                            const CommOptions& comm,
                                                            Communicator* world) {
  const Device dev = model.device();
  const DType dt = model.dtype();
  if (cp_size > 1 && dev.is_cpu()) {
    LT_CHECK_INPUT(dt == DType::kF32, "option cp_size ", cp_size,
                   ": the CPU ring attention takes f32; drop --bf16 (or run on CUDA with "
                   "--comm_backend nccl)");
  } else if (cp_size > 1) {
    LT_CHECK_INPUT(comm.backend == "nccl", "option cp_size ", cp_size, " on ", dev.str(),
                   ": the ring attention on CUDA needs --comm_backend nccl (got ", comm.backend,
                   ")");
    LT_CHECK_INPUT(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16, "option cp_size ",
                   cp_size,
                   ": the CUDA ring attention takes f32, bf16 or f16, "
                   "not ",
                   dtype_name(dt));
  }
  return std::make_shared<ContextParallelGroups>(
      make_context_parallel_groups(world ? *world : world_communicator(comm), cp_size));
}

namespace {

// Every rank of the group computes the same loss from the summed values, so the gradient of a
// rank's partial is the gradient of the sum itself.
class CpSumBackward final : public Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return {std::move(grads[0])}; }
  std::string name() const override { return "CpSumBackward"; }
};

}  // namespace

Tensor cp_sum(const Tensor& x, Communicator& comm) {
  Tensor out = x.detach().clone(MemTag::kActivation);
  comm.all_reduce(out, ReduceOp::kSum);
  if (node_needed({x})) {
    auto node = std::make_shared<CpSumBackward>();
    node->set_next_edges({x});
    set_history(out, node);
  }
  return out;
}

CpScoring::CpScoring(const Batch& global, const ContextParallelGroups* groups, int64_t pad_token_id)
    : global_(global) {
  if (!groups || groups->cp_size <= 1) return;
  cp_ = groups->cp.get();
  split_ = split_context_parallel(global, groups->cp_size, groups->cp_rank, pad_token_id, cp_);
}

kernels::SequenceLogprobs CpScoring::policy(const DecoderModel& model,
                                            SequenceLogpsOptions opts) const {
  if (!split_) return sequence_logps(model, global_, opts);
  opts.context_parallel = split_->context;
  kernels::SequenceLogprobs s = sequence_logps(model, split_->local, opts);
  s.logps = cp_sum(s.logps, *cp_);
  cp_sum_sequence_stats(s, *cp_);
  return s;
}

std::vector<double> CpScoring::reference(ReferenceModel& ref, const std::vector<int64_t>& keys,
                                         const SequenceLogpsOptions& opts,
                                         const DecoderModel& model) const {
  if (!split_ || ref.mode() == RefMode::kPrecomputed) return ref.logps(global_, keys, opts);
  SequenceLogpsOptions o = opts;
  o.context_parallel = split_->context;
  return cp_sum_values(ref.logps(split_->local, keys, o), model, *cp_);
}

std::vector<double> cp_sum_values(const std::vector<double>& partial, const DecoderModel& model,
                                  Communicator& comm) {
  const DType dt = model.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor sums = Tensor::from_doubles(partial, {static_cast<int64_t>(partial.size())}, dt)
                    .to(model.device(), dt, MemTag::kComm);
  comm.all_reduce(sums);
  return sums.to_f64();
}

void cp_sum_sequence_stats(kernels::SequenceLogprobs& s, Communicator& comm) {
  // A few numbers per sequence: host scalars, summed in rank order on every backend.
  for (int64_t& v : s.tokens) v = comm.all_reduce_int(v);
  for (double& v : s.logit_sums) v = comm.all_reduce_scalar(v);
  for (double& v : s.entropy_sums) v = comm.all_reduce_scalar(v);
  for (int64_t& v : s.top1_counts) v = comm.all_reduce_int(v);
}

}  // namespace leantune
