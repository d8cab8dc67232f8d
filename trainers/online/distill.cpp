// trainer_bin distill's loss (TRL 1.16's DistillationTrainer; see distill.h): the divergence of a
// micro-batch summed over its completion tokens and divided by the completion tokens of the whole
// generation batch on every rank (TRL's num_items_in_batch; the trainer sums the ranks'
// gradients). Neither model's logits exist whole. Metric: TRL's `entropy` (the student's mean
// per-token entropy, in nats, over the micro-batch's completion tokens of every rank).
#include "trainers/online/distill.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear_divergence.h"
#include "loaders/dataset.h"
#include "loaders/examples.h"
#include "loaders/model_config.h"
#include "trainers/online/grpo.h"

namespace leantune {

DistillDivergence distill_divergence(const DecoderModel& student, const DecoderModel& teacher,
                                     const Batch& b, const DistillOptions& opt) {
  const Device dev = student.device();
  const Tensor ids = b.input_ids.to(dev), pos = b.position_ids.to(dev), cu = b.cu_seqlens.to(dev);
  const SeqHints seqs = seq_hints(b);
  const Tensor hs = student.hidden_states(ids, pos, cu, seqs, opt.gradient_checkpointing);
  Tensor ht;
  {
    NoGradGuard ng;
    MemSiteGuard site("teacher");
    ht = teacher.hidden_states(ids, pos, cu, seqs, false);
  }
  // Row t predicts the token at t + 1: the rows whose next token is a completion token count.
  DistillDivergence out;
  out.mask = kernels::shift_labels(b.labels, b.cu_seqlens).to_i64();
  for (int64_t& m : out.mask) m = m == kernels::kIgnoreIndex ? 0 : 1;
  const auto n = static_cast<int64_t>(out.mask.size());
  kernels::LinearDivergenceOptions o;
  o.beta = opt.beta;
  o.temperature = opt.temperature;
  o.student_softcap = student.logit_softcap();
  o.teacher_softcap = teacher.logit_softcap();
  o.chunk_tokens = opt.chunk_tokens;
  const kernels::LinearDivergence d =
      kernels::linear_divergence(hs, student.lm_head_weight(), ht, teacher.lm_head_weight(),
                                 Tensor::from_vector<int64_t>(out.mask, {n}), o);
  const std::vector<double> div = d.divergence.to_f64(), ent = d.entropy.to_f64();
  for (int64_t i = 0; i < n; ++i) {
    if (out.mask[i] == 0) continue;
    out.sum += div[i];
    out.entropy_sum += ent[i];
    out.tokens += 1;
  }
  out.divergence = d.divergence;
  return out;
}

Tensor OnlineTrainer::distill_loss(const Batch& b, const LossContext& ctx) {
  LT_CHECK(teacher_ != nullptr, "distill: no teacher model");
  DistillOptions opt;
  opt.beta = cfg_.distill_beta;
  opt.temperature = cfg_.distill_temperature;
  opt.chunk_tokens = cfg_.logps.chunk_tokens;
  opt.gradient_checkpointing = args_.gradient_checkpointing;
  const DistillDivergence d = distill_divergence(*model_, *teacher_, b, opt);
  distill_rows_max_ = std::max(distill_rows_max_, static_cast<int64_t>(d.mask.size()));
  // ctx.dapo_tokens: the generation batch's completion tokens on every rank.
  const double scale = 1.0 / ctx.dapo_tokens;
  std::vector<double> grad(d.mask.size(), 0.0);
  for (size_t i = 0; i < d.mask.size(); ++i)
    if (d.mask[i] != 0) grad[i] = scale;
  nlohmann::json m = *ctx.batch_metrics;
  // TRL gathers the entropy sums and token counts of every rank before dividing.
  double entropy = d.entropy_sum, tokens = static_cast<double>(d.tokens);
  if (comm().size() > 1) {
    entropy = comm().all_reduce_scalar(entropy);
    tokens = comm().all_reduce_scalar(tokens);
  }
  m["entropy"] = tokens > 0 ? entropy / tokens : 0.0;
  if (ctx.window)
    ctx.window->add(m);
  else
    *ctx.record = std::move(m);
  return loss_from_sequence_gradient(d.divergence, d.sum * scale, std::move(grad));
}

void attach_dataset_completions(OnlinePrompts& prompts, const JsonlSource& source,
                                const TextEncoder& enc, int64_t max_completion_length) {
  DatasetReader reader(source);
  DataConfig cfg;  // TRL's SFT defaults: completion_only_loss on prompt_completion rows
  DataStats stats;
  Record rec;
  size_t k = 0;
  int64_t tokens = 0, cut = 0;
  while (reader.next(&rec)) {
    LT_CHECK_INPUT(reader.format().kind == DatasetKind::kPromptCompletion, source.path,
                   ": distill with --lmbda below 1 takes the dataset's completions on off-policy "
                   "batches; its rows must be prompt_completion (prompt and completion), not ",
                   reader.format().name());
    LT_CHECK(k < prompts.rows.size() && prompts.rows[k].line == rec.line,
             "distill: the dataset's rows changed while it was read (line ", rec.line, ")");
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    tokenize_sft_record(rec, reader.format(), &enc, cfg, &ids, &mask, &stats);
    // The completion: what follows the prompt part (mask 0) of prompt + completion.
    const auto first = std::find(mask.begin(), mask.end(), uint8_t{1});
    PromptRow& row = prompts.rows[k++];
    row.completion.assign(ids.begin() + (first - mask.begin()), ids.end());
    LT_CHECK_INPUT(!row.completion.empty(), source.path, ":", rec.line,
                   ": the completion tokenizes to nothing");
    if (static_cast<int64_t>(row.completion.size()) > max_completion_length) {
      row.completion.resize(static_cast<size_t>(max_completion_length));
      row.completion_cut = true;
      ++cut;
    }
    tokens += static_cast<int64_t>(row.completion.size());
  }
  LT_CHECK(k == prompts.rows.size(), "distill: ", prompts.rows.size() - k,
           " prompt rows have no completion");
  prompts.completions_summary =
      std::to_string(k) + " dataset completions for off-policy batches (" + std::to_string(tokens) +
      " tokens; " + std::to_string(cut) + " cut to max_completion_length " +
      std::to_string(max_completion_length) + "; " + std::to_string(stats.prompt_mismatch) +
      " prompts tokenized differently inside prompt + completion)";
}

DType distill_teacher_dtype(const std::string& init_kwargs, DType student,
                            const std::string& teacher_dir) {
  if (init_kwargs.empty()) return student;
  const char* opt = "option --teacher_model_init_kwargs";
  nlohmann::json kw;
  try {
    kw = nlohmann::json::parse(init_kwargs);
  } catch (const nlohmann::json::exception&) {
    LT_THROW(ErrorKind::kInput, opt, ": '", init_kwargs, "' is not JSON");
  }
  LT_CHECK_INPUT(kw.is_object(), opt, ": '", init_kwargs, "' must be a JSON object");
  DType dt = student;
  for (const auto& [key, value] : kw.items()) {
    LT_CHECK_INPUT(key == "torch_dtype" || key == "dtype", opt, ": key '", key,
                   "' is not supported (supported: torch_dtype, dtype; quantize the teacher with "
                   "--teacher_load_in_4bit or --teacher_load_in_8bit)");
    LT_CHECK_INPUT(value.is_string(), opt, ": ", key, " must be a string");
    const std::string name = value.get<std::string>();
    if (name == "auto") {
      dt = teacher_dir.empty() ? student
                               : ModelConfig::load(teacher_dir + "/config.json").torch_dtype;
      continue;
    }
    LT_CHECK_INPUT(dtype_from_string(name, &dt) && dtype_is_floating(dt) && dt != DType::kF64, opt,
                   ": ", key, " '", name, "' is not one of bfloat16, float16, float32, auto");
  }
  return dt;
}

double distill_off_policy_draw(uint64_t seed) {
  std::mt19937_64 g(seed ^ 0x6c6d626461ULL);  // "lmbda"
  return std::uniform_real_distribution<double>(0.0, 1.0)(g);
}

}  // namespace leantune
