// The online trainer (grpo, rloo, online_dpo): generation batches, rewards, advantages and the
// loss hook. See grpo.h.
#include "trainers/online/grpo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/checked_int.h"
#include "engine/mem_phase.h"
#include "engine/ops.h"
#include "kernels/cross_entropy.h"
#include "loaders/host_batch.h"
#include "loaders/hub_cache.h"
#include "models/quantize_model.h"
#include "trainers/common/model_io.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/trainer_spec.h"

namespace leantune {

namespace fs = std::filesystem;

OnlineTrainer::OnlineTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model,
                             Options options, std::shared_ptr<Tokenizer> tokenizer,
                             std::string tokenizer_dir, OnlinePrompts data, OnlineConfig cfg,
                             std::unique_ptr<RewardSources> rewards)
    : Trainer(std::move(args), std::move(model), std::move(options)),
      tokenizer_(std::move(tokenizer)),
      data_(std::move(data)),
      cfg_(std::move(cfg)),
      rewards_(std::move(rewards)),
      prompts_(static_cast<int64_t>(data_.rows.size()),
               cfg_.completions_per_micro_batch * cfg_.steps_per_generation / cfg_.num_generations,
               args_.seed, true, "prompts", /*drop_last=*/true) {
  tokenizer_dir_ = std::move(tokenizer_dir);
  Communicator& comm = this->comm();
  const int64_t per_generation =
      cfg_.completions_per_micro_batch * cfg_.steps_per_generation / cfg_.num_generations;
  LT_CHECK_INPUT(prompts_.per_epoch(comm) > 0, data_.path, ": ", data_.rows.size(),
                 " prompts, fewer than one generation batch of ", per_generation * comm.size(),
                 " (", per_generation, " per rank x ", comm.size(), " ranks)");
  cfg_.logps.gradient_checkpointing = args_.gradient_checkpointing;
  kv_blocks_ = plan_kv_blocks();
  stats_.path = data_.path;
  stats_.format = data_.conversational ? "prompt_only (conversational)" : "prompt_only";
  stats_.records = stats_.examples = static_cast<int64_t>(data_.rows.size());
}

void OnlineTrainer::set_reference(RefModelConfig cfg) {
  if (cfg_.loss.beta == 0.0) return;  // no KL term: TRL loads no reference model either
  ref_ = std::make_unique<ReferenceModel>(std::move(cfg), model_, &peft_);
}

int64_t OnlineTrainer::micro_batches_per_epoch() const {
  return prompts_.per_epoch(comm()) * cfg_.steps_per_generation * cfg_.num_iterations;
}

double OnlineTrainer::epoch_progress() const { return prompts_.progress(comm()); }

Batch OnlineTrainer::collate(const std::vector<Rollout>& rs) const {
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu{0};
  BatchStats st;
  int64_t longest = 0;
  for (const Rollout& r : rs) {
    const std::vector<int32_t>& whole = r.row->ids;
    // online_dpo's max_length: the prompt loses its first tokens (TRL truncates left), keeping
    // at least the one that scores the completion's first token.
    const size_t cut = prompt_cut(whole.size(), r.completion.size());
    const std::vector<int32_t> p(whole.begin() + static_cast<int64_t>(cut), whole.end());
    const int64_t n = static_cast<int64_t>(p.size() + r.completion.size());
    for (size_t t = 0; t < p.size(); ++t) {
      ids.push_back(p[t]);
      labels.push_back(kernels::kIgnoreIndex);
    }
    for (size_t j = 0; j < r.completion.size(); ++j) {
      ids.push_back(r.completion[j]);
      labels.push_back(r.mask[j] ? r.completion[j] : kernels::kIgnoreIndex);
      st.label_tokens += r.mask[j];
    }
    for (int64_t t = 0; t < n; ++t) pos.push_back(t);
    cu.push_back(cu.back() + static_cast<int32_t>(n));
    st.real_tokens += n;
    longest = std::max(longest, n);
  }
  st.sequences = static_cast<int64_t>(rs.size());
  return host_batch(ids, pos, labels, cu, longest, st);
}

size_t OnlineTrainer::prompt_cut(size_t prompt, size_t completion) const {
  if (cfg_.max_length <= 0 || static_cast<int64_t>(prompt + completion) <= cfg_.max_length)
    return 0;
  const int64_t keep = std::max<int64_t>(1, cfg_.max_length - static_cast<int64_t>(completion));
  return prompt - static_cast<size_t>(std::min<int64_t>(keep, static_cast<int64_t>(prompt)));
}

std::vector<std::vector<double>> OnlineTrainer::completion_values(
    const std::vector<Rollout>& rs, const std::vector<double>& rows) const {
  // Completion token j of sequence i sits at offset + prompt_len + j and is scored by the row
  // before it.
  std::vector<std::vector<double>> out;
  size_t offset = 0;
  for (const Rollout& r : rs) {
    const size_t whole = r.row->ids.size();
    const size_t p = whole - prompt_cut(whole, r.completion.size());
    std::vector<double> v(r.completion.size());
    for (size_t j = 0; j < v.size(); ++j) {
      const size_t row = offset + p + j - 1;
      LT_CHECK(row < rows.size(), "online trainer: row ", row, " outside ", rows.size());
      v[j] = r.mask[j] ? rows[row] : 0.0;
    }
    offset += p + r.completion.size();
    out.push_back(std::move(v));
  }
  return out;
}

void OnlineTrainer::generate_batch() {
  const auto start = std::chrono::steady_clock::now();
  if (generations_ > 0) optimization_s_ = std::chrono::duration<double>(start - phase_end_).count();
  const std::vector<int64_t> idx = prompts_.next(comm());
  ScoredBatch sb = generate_and_score(
      data_, idx, args_.seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(generations_ + 1),
      "generation batch " + std::to_string(generations_ + 1), true);
  if (generations_ > 0) sb.metrics["timing/optimization_s"] = optimization_s_;
  gen_metrics_ = std::move(sb.metrics);
  // Shuffle (TRL shuffles the generation batch) and cut into micro-batches.
  std::vector<Rollout>& all = sb.rollouts;
  std::mt19937_64 rng(args_.seed * 1000003ULL + static_cast<uint64_t>(generations_));
  if (cfg_.algorithm != "online_dpo") std::shuffle(all.begin(), all.end(), rng);  // pairs adjacent
  gen_tokens_ = sb.loss_tokens;
  buffer_.clear();
  const size_t mb = static_cast<size_t>(cfg_.completions_per_micro_batch);
  for (size_t b0 = 0; b0 < all.size(); b0 += mb)
    buffer_.emplace_back(all.begin() + static_cast<int64_t>(b0),
                         all.begin() + static_cast<int64_t>(std::min(all.size(), b0 + mb)));
  ++generations_;
  phase_end_ = std::chrono::steady_clock::now();
}

Batch OnlineTrainer::next_micro_batch(BatchReport* report) {
  const int64_t every = cfg_.steps_per_generation * cfg_.num_iterations;
  if (micro_step_ % every == 0 || buffer_.empty()) generate_batch();
  const std::vector<Rollout>& rs =
      buffer_[static_cast<size_t>(micro_step_ % cfg_.steps_per_generation)];
  ++micro_step_;
  Batch b = collate(rs);
  if (report) {
    report->real_tokens = b.stats.real_tokens;
    report->pad_tokens = 0;
  }
  pending_.push_back(rs);
  return b;
}

void OnlineTrainer::check_rewards(const std::vector<double>& rewards_g, std::vector<Rollout>& all,
                                  const std::string& label) {
  int64_t unscored = 0;
  for (double r : rewards_g) unscored += std::isnan(r) ? 1 : 0;
  const std::string batch = label + ": ";
  if (unscored > 0)
    warn("warning: " + batch + std::to_string(unscored) + " of " +
         std::to_string(rewards_g.size()) +
         " completions got no reward (every source answered null); their advantage is 0");
  const std::string why = nonfinite_rewards(rewards_g, cfg_.num_generations);
  if (why.empty()) return;
  warn("warning: " + batch + "the rewards are not finite (" + why +
       "); its updates are skipped as non-finite");
  for (Rollout& r : all) r.nonfinite_reward = true;
}

Tensor OnlineTrainer::compute_loss(const Batch& b, double normalizer) {
  (void)normalizer;  // the loss types carry their own normalisers (grpo_loss.h)
  LT_CHECK(!pending_.empty(), "online trainer: compute_loss without a fetched micro-batch");
  const std::vector<Rollout> rs = std::move(pending_.front());
  pending_.pop_front();
  // TRL's per-process loss; the ranks' gradients are summed here where DDP averages them, so
  // each rank's loss is divided by the world size (dapo's normaliser is already global).
  const double gas = static_cast<double>(current_accumulation_steps());
  const LossContext ctx{gas * static_cast<double>(comm().size()),
                        std::max<double>(1.0, static_cast<double>(gen_tokens_)) * gas /
                            static_cast<double>(cfg_.steps_per_generation),
                        &gen_metrics_, &window_};
  Tensor loss = cfg_.algorithm == "online_dpo" ? online_dpo_loss(b, rs, ctx)
                : cfg_.algorithm == "distill"  ? distill_loss(b, ctx)
                                               : policy_loss(b, rs, ctx);
  if (!rs.empty() && rs.front().nonfinite_reward) loss = ops::scale(loss, std::nan(""));
  return loss;
}

void OnlineTrainer::discard_micro_batches(size_t count) {
  LT_CHECK(count <= pending_.size(), "discard_micro_batches: ", count, " of ", pending_.size());
  pending_.erase(pending_.end() - static_cast<std::ptrdiff_t>(count), pending_.end());
}

Tensor OnlineTrainer::policy_loss(const Batch& b, const std::vector<Rollout>& rs,
                                  const LossContext& ctx) {
  const bool rloo = cfg_.algorithm == "rloo";
  SequenceLogpsOptions lo = cfg_.logps;
  lo.per_token = !rloo;
  lo.row_stats = true;
  kernels::SequenceLogprobs pol = sequence_logps(*model_, b, lo);
  const std::vector<double> rows = pol.logps.to_f64();
  std::vector<GrpoSequence> seqs(rs.size());
  GrpoLossConfig lc = cfg_.loss;
  double entropy = 0;
  int64_t counted = 0;
  for (size_t i = 0; i < pol.entropy_sums.size(); ++i) {
    entropy += pol.entropy_sums[i];
    counted += pol.tokens[i];
  }
  if (rloo) {
    lc.loss_type = "grpo";  // one "token" per sequence: the mean over sequences
    lc.beta = 0.0;          // RLOO's KL is in the reward
    for (size_t i = 0; i < rs.size(); ++i) {
      seqs[i].logp = {rows[i]};
      seqs[i].old_logp = {rs[i].old_sum};
      seqs[i].mask = {1};
      seqs[i].advantage = rs[i].advantage;
    }
  } else {
    const auto v = completion_values(rs, rows);
    for (size_t i = 0; i < rs.size(); ++i) {
      seqs[i].logp = v[i];
      seqs[i].old_logp = rs[i].old_logp.empty() ? v[i] : rs[i].old_logp;
      seqs[i].ref_logp = rs[i].ref_logp;
      seqs[i].mask = rs[i].mask;
      seqs[i].advantage = rs[i].advantage;
    }
  }
  GrpoLossResult res = grpo_loss(lc, seqs, ctx.divisor, ctx.dapo_tokens);
  std::vector<double> grad(rows.size(), 0.0);
  if (rloo) {
    for (size_t i = 0; i < rs.size(); ++i) grad[i] = res.dlogp[i][0];
  } else {
    size_t offset = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      const size_t whole = rs[i].row->ids.size();
      const size_t p = whole - prompt_cut(whole, rs[i].completion.size());
      for (size_t j = 0; j < rs[i].completion.size(); ++j)
        grad[offset + p + j - 1] = res.dlogp[i][j];
      offset += p + rs[i].completion.size();
    }
  }
  nlohmann::json metrics = *ctx.batch_metrics;
  for (auto it = res.metrics.begin(); it != res.metrics.end(); ++it) metrics[it.key()] = it.value();
  metrics["entropy"] = counted > 0 ? entropy / static_cast<double>(counted) : 0.0;
  if (ctx.window)
    ctx.window->add(metrics);
  else
    *ctx.record = std::move(metrics);
  return loss_from_sequence_gradient(pol.logps, res.loss, std::move(grad));
}

Tensor OnlineTrainer::online_dpo_loss(const Batch& b, const std::vector<Rollout>& rs,
                                      const LossContext& ctx) {
  SequenceLogpsOptions lo = cfg_.logps;
  lo.per_token = false;
  kernels::SequenceLogprobs pol = sequence_logps(*model_, b, lo);
  const std::vector<double> lp = pol.logps.to_f64();
  // Mean over pairs, over accumulation, over ranks (the ranks' gradients are summed).
  const double beta = cfg_.loss.beta, gas = ctx.divisor;
  const size_t pairs = rs.size() / 2;
  std::vector<double> grad(lp.size(), 0.0);
  double loss = 0, lc = 0, lr = 0, rc = 0, rr = 0, acc = 0, kl = 0, rlhf = 0;
  for (size_t k = 0; k + 1 < rs.size(); k += 2) {
    const size_t c = rs[k].chosen ? k : k + 1, r = rs[k].chosen ? k + 1 : k;
    // x = (pi_c - pi_r) - (ref_c - ref_r); sigmoid: -log sigmoid(beta x); ipo: (x - 1/(2 beta))^2.
    const double x = (lp[c] - lp[r]) - (rs[c].ref_sum - rs[r].ref_sum);
    double l, dx;
    if (cfg_.dpo_loss_type == "ipo") {
      const double d = x - 1.0 / (2.0 * beta);
      l = d * d;
      dx = 2.0 * d;
    } else {
      const double z = beta * x;
      l = z > 0 ? std::log1p(std::exp(-z)) : -z + std::log1p(std::exp(z));
      dx = -beta / (1.0 + std::exp(z));
    }
    const double scale = 1.0 / (static_cast<double>(pairs) * gas);
    loss += l * scale;
    grad[c] += dx * scale;
    grad[r] -= dx * scale;
    lc += lp[c];
    lr += lp[r];
    rc += beta * (lp[c] - rs[c].ref_sum);
    rr += beta * (lp[r] - rs[r].ref_sum);
    acc += (lp[c] - rs[c].ref_sum) - (lp[r] - rs[r].ref_sum) > 0 ? 1.0 : 0.0;
  }
  double entropy = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    kl += lp[i] - rs[i].ref_sum;
    rlhf += rs[i].reward - beta * (lp[i] - rs[i].ref_sum);
    entropy -= lp[i];
  }
  const double np = static_cast<double>(pairs), ns = static_cast<double>(rs.size());
  // TRL's names (OnlineDPOTrainer.training_step); sums over the completion mask.
  nlohmann::json m = *ctx.batch_metrics;
  m["logps/chosen"] = lc / np;
  m["logps/rejected"] = lr / np;
  m["objective/kl"] = kl / ns;
  m["objective/non_score_reward"] = -beta * kl / ns;
  m["objective/rlhf_reward"] = nan_as_null(rlhf / ns);
  m["objective/entropy"] = entropy / ns;
  m["rewards/chosen"] = rc / np;
  m["rewards/rejected"] = rr / np;
  m["rewards/margins"] = (rc - rr) / np;
  m["rewards/accuracies"] = acc / np;
  m["beta"] = beta;
  if (ctx.window)
    ctx.window->add(m);
  else
    *ctx.record = std::move(m);
  return loss_from_sequence_gradient(pol.logps, loss, std::move(grad));
}

nlohmann::json OnlineTrainer::log_metrics() { return window_.take(); }

std::optional<nlohmann::json> OnlineTrainer::evaluate() {
  if (!eval_) return std::nullopt;
  // As TRL evaluates: batches of per_device_eval_batch_size completions per rank (whole groups of
  // num_generations; online_dpo: that many prompts, two completions each), generated and scored
  // as in training, the loss with the current weights as the old ones and no accumulation. Each
  // evaluation draws the same seeds, so evaluations differ only by the weights.
  const bool dpo = cfg_.algorithm == "online_dpo";
  const int64_t per = dpo ? args_.per_device_eval_batch_size
                          : args_.per_device_eval_batch_size / cfg_.num_generations;
  Communicator& comm = this->comm();
  const int64_t world = comm.size(), global = per * world;
  const int64_t n = static_cast<int64_t>(eval_->rows.size());
  MetricWindow window;
  double loss_sum = 0, completions = 0;
  NoGradGuard no_grad;
  MemPhaseGuard phase(MemPhaseKind::kEvaluation);
  for (int64_t start = 0; start < n; start += global) {
    // This rank's prompts of the global batch; past the end, the first ones again (every rank
    // completes as many, so that the batch's values gather in rank order).
    std::vector<int64_t> idx;
    const int64_t count = world > 1 ? per : std::min(per, n - start);
    for (int64_t j = 0; j < count; ++j) idx.push_back((start + comm.rank() * per + j) % n);
    const ScoredBatch sb =
        generate_and_score(*eval_, idx, args_.seed + 0xE7A1ULL * static_cast<uint64_t>(start + 1),
                           "evaluation batch " + std::to_string(start / global + 1), false);
    nlohmann::json record;
    // As in training, each rank's loss is its share (divided by the world size; dapo's
    // normaliser counts every rank's tokens): the batch's loss is their sum.
    const LossContext ctx{static_cast<double>(world),
                          std::max<double>(1.0, static_cast<double>(sb.loss_tokens)), &sb.metrics,
                          nullptr, &record};
    AdapterEvalScope eval(peft_);
    const Batch b = collate(sb.rollouts);
    const double loss = (dpo                           ? online_dpo_loss(b, sb.rollouts, ctx)
                         : cfg_.algorithm == "distill" ? distill_loss(b, ctx)
                                                       : policy_loss(b, sb.rollouts, ctx))
                            .item();
    const double batch = static_cast<double>(sb.rollouts.size()) * static_cast<double>(world);
    double batch_loss = loss;
    if (world > 1) {
      // The record's keys are the same on every rank (one code path); a NaN or null value is
      // NaN in the mean, which the window then leaves out.
      for (auto& [k, v] : record.items()) {
        const double x = v.is_number() ? v.get<double>() : std::nan("");
        v = comm.all_reduce_scalar(x) / static_cast<double>(world);
      }
      batch_loss = comm.all_reduce_scalar(loss);
    }
    loss_sum += batch_loss * batch;
    completions += batch;
    window.add(record);
  }
  nlohmann::json out = window.take();
  out["loss"] = loss_sum / std::max(completions, 1.0);
  return out;
}

nlohmann::json OnlineTrainer::data_state() const {
  nlohmann::json s = prompts_.state();
  s["micro_step"] = micro_step_;
  s["generations"] = generations_;
  return s;
}

void OnlineTrainer::set_data_state(const nlohmann::json& s) {
  prompts_.set_state(s, comm());
  // The buffered generation batch is not checkpointed: the next micro-batch generates afresh.
  micro_step_ = s.value("micro_step", int64_t{0});
  generations_ = s.value("generations", int64_t{0});
  buffer_.clear();
  pending_.clear();
}

void OnlineTrainer::on_train_begin(MetricsLogger& log) {
  check_generation_memory();
  log.message(data_.summary());
  if (eval_) log.message(eval_->summary());
  std::string sources = judge_     ? "judge " + judge_->describe()
                        : teacher_ ? "a frozen teacher of " +
                                         std::to_string(teacher_->num_parameters()) + " parameters"
                                   : "rewards ";
  for (size_t f = 0; rewards_ && f < rewards_->names().size(); ++f)
    sources +=
        (f ? ", " : "") + rewards_->names()[f] + " x" + std::to_string(rewards_->weights()[f]);
  log.message(cfg_.algorithm + ": " + std::to_string(cfg_.num_generations) +
              " completions per prompt, up to " + std::to_string(cfg_.generation.max_new_tokens) +
              " tokens; " + sources +
              (ref_ ? std::string("; reference ") + ref_mode_name(ref_->mode()) : ""));
}

void OnlineTrainer::close_optimizer_window(PhasePeaks& into) const {
  const AllocatorStats st = allocator(model_->device()).stats();
  into.allocated = std::max(into.allocated, st.window_allocated.peak);
  into.reserved = std::max(into.reserved, st.window_reserved.peak);
}

nlohmann::json OnlineTrainer::technique_savings() const {
  nlohmann::json s = nlohmann::json::object();
  if (ref_) s["reference_model"] = ref_->memory_json();
  // The last optimizer phase runs up to now (the report is made at the end of training).
  PhasePeaks optimizer = optimizer_peak_;
  if (generations_ > 0) close_optimizer_window(optimizer);
  s["generation"] = {{"kv_cache_pool_bytes", kv_pool_ ? kv_pool_->bytes() : 0},
                     {"kv_cache_blocks", kv_pool_ ? kv_pool_->num_blocks() : 0},
                     {"kv_block_size", cfg_.kv_block_size},
                     {"kv_blocks_peak_used", kv_pool_ ? kv_pool_->peak_blocks_used() : 0},
                     {"sleep_mode", cfg_.sleep_mode},
                     {"sleep_released_bytes", sleep_released_},
                     {"generation_phase_peak_allocated", generation_peak_.allocated},
                     {"generation_phase_peak_reserved", generation_peak_.reserved},
                     {"optimizer_phase_peak_allocated", optimizer.allocated},
                     {"optimizer_phase_peak_reserved", optimizer.reserved}};
  if (teacher_) {
    // The student's logits, their gradient and the teacher's, each [rows x V] in f32.
    const int64_t v = model_->config().vocab_size;
    s["chunked_divergence"] = {
        {"largest_micro_batch_tokens", distill_rows_max_},
        {"vocab_size", v},
        {"logits_bytes_not_materialised", (CheckedInt(distill_rows_max_) * v * 3 * 4).get()}};
  }
  if (teacher_offload_) {
    const OffloadedWeightsStats& st = teacher_offload_->stats();
    s["teacher_offload"] = {{"host_bytes", st.host_bytes},
                            {"layers", teacher_->num_layers()},
                            {"resident_peak", st.resident_peak},
                            {"bytes_copied", st.bytes_copied},
                            {"layers_prefetched", st.layers_prefetched},
                            {"layers_copied_now", st.layers_copied_now}};
  }
  add_adapter_savings(s, *model_, peft_, quant_config_, quant_report_);
  return s;
}

namespace {
// a x b completions, refused (exit 2) past 2^63.
int64_t checked_batch(const std::string& algorithm, const char* a_name, int64_t a,
                      const char* b_name, int64_t b) {
  try {
    return (CheckedInt(a) * b).get();
  } catch (const OverflowError&) {
    LT_THROW(ErrorKind::kInput, algorithm, ": the generation batch (", a_name, " ", a, " x ",
             b_name, " ", b, ") passes 2^63 completions");
  }
}
}  // namespace

OnlineRun make_online_run(const std::string& algorithm, const Options& o,
                          std::optional<SftModel> model, const RunInputs& in) {
  // The demo model trains on the demo data only; a model given by the embedder (public API)
  // trains on whatever it is given.
  if (!model) check_model_for_dataset(algorithm, o);
  TrainingArguments args = training_arguments(o);
  LT_CHECK_INPUT(args.cp_size == 1, algorithm, ": --cp_size > 1 is for ",
                 context_parallel_trainer_names());
  const bool distill = algorithm == "distill";
  // distill has a teacher instead of a reference model.
  const RefModelConfig ref_cfg =
      distill ? RefModelConfig{} : ref_model_config(o, args.per_device_eval_batch_size);
  LT_CHECK_INPUT(!ref_cfg.precompute,
                 "option --precompute_ref_log_probs: the online trainers "
                 "score fresh completions; nothing can be precomputed");
  const OnlineArguments oa = online_table(algorithm).read(o);
  OnlineConfig cfg;
  cfg.algorithm = algorithm;
  const bool dpo = algorithm == "online_dpo";
  cfg.loss.beta = distill ? 0.0 : oa.beta;
  LT_CHECK_INPUT(cfg.loss.beta != 0.0 || dpo || ref_cfg.ref_model.empty(),
                 "option --ref_model: beta is 0, so no reference model is used");
  if (distill) {
    // DistillationTrainer: one completion per prompt, a generation batch of
    // per_device_train_batch_size x gradient_accumulation_steps prompts.
    cfg.distill_beta = oa.beta;
    cfg.distill_temperature = oa.temperature;
    cfg.distill_lmbda = oa.lmbda;
    cfg.distill_seq_kd = oa.seq_kd;
    LT_CHECK_INPUT(!oa.seq_kd || oa.lmbda < 1.0,
                   "option --seq_kd: with --lmbda 1 every batch is the student's own; the "
                   "teacher generates the off-policy ones (set --lmbda below 1)");
    cfg.num_generations = 1;
    cfg.completions_per_micro_batch = args.per_device_train_batch_size;
    cfg.steps_per_generation = args.gradient_accumulation_steps;
    cfg.num_iterations = 1;
    cfg.generation.max_new_tokens = oa.max_completion_length;
  } else if (dpo) {
    // Two completions per prompt, generated for every micro-batch of prompts.
    cfg.num_generations = 2;
    cfg.completions_per_micro_batch =
        checked_batch(algorithm, "per_device_train_batch_size", args.per_device_train_batch_size,
                      "completions per prompt", 2);
    cfg.steps_per_generation = 1;
    cfg.num_iterations = 1;
    cfg.generation.max_new_tokens = oa.max_new_tokens;
    cfg.dpo_loss_type = oa.loss_type;
    cfg.missing_eos_penalty = oa.missing_eos_penalty;
    cfg.max_length = oa.max_length;
    LT_CHECK_INPUT(cfg.dpo_loss_type != "ipo" || cfg.loss.beta > 0,
                   "option --beta: the ipo loss needs beta > 0");
  } else {
    cfg.num_generations = oa.num_generations;
    cfg.completions_per_micro_batch = args.per_device_train_batch_size;
    cfg.steps_per_generation = oa.steps_per_generation.value_or(args.gradient_accumulation_steps);
    cfg.num_iterations = oa.num_iterations;
    const int64_t gen_batch =
        checked_batch(algorithm, "per_device_train_batch_size", args.per_device_train_batch_size,
                      "steps_per_generation", cfg.steps_per_generation);
    LT_CHECK_INPUT(gen_batch % cfg.num_generations == 0, algorithm,
                   ": the generation batch (per_device_train_batch_size x steps_per_generation = ",
                   gen_batch, ") must be a multiple of num_generations ", cfg.num_generations);
    cfg.generation.max_new_tokens = oa.max_completion_length;
    cfg.loss.epsilon_low = oa.epsilon;
    cfg.loss.epsilon_high = oa.epsilon_high < 0 ? cfg.loss.epsilon_low : oa.epsilon_high;
    cfg.loss.max_completion_length = cfg.generation.max_new_tokens;
    if (algorithm == "grpo") {
      cfg.loss.loss_type = oa.loss_type;
      cfg.scale_rewards = oa.scale_rewards;
      cfg.loss.use_bias_correction_kl = oa.use_bias_correction_kl;
    } else {
      cfg.normalize_advantages = oa.normalize_advantages;
    }
    cfg.mask_truncated_completions = oa.mask_truncated_completions;
  }
  cfg.kv_cache_blocks = oa.kv_cache_blocks;
  cfg.kv_block_size = oa.kv_block_size;
  cfg.sleep_mode = oa.vllm_enable_sleep_mode;
  cfg.ds3_gather_for_generation = oa.ds3_gather_for_generation;
  cfg.generation.temperature = oa.temperature;
  cfg.generation.top_p = oa.top_p;
  cfg.generation.top_k = oa.top_k;
  cfg.generation.min_p = oa.min_p;
  cfg.generation.repetition_penalty = oa.repetition_penalty;
  cfg.logps.fused = oa.use_liger_loss;
  // GRPO and RLOO score under the sampling temperature; OnlineDPOTrainer's forward does not.
  cfg.logps.temperature = dpo ? 1.0 : cfg.generation.temperature;
  prepare_run(args);
  OnlineRun run;
  const bool given_model = model.has_value();  // an embedder's model (public API)
  run.model = model ? std::move(*model) : load_sft_model(o);
  const SftModel& m = run.model;
  // online_dpo --judge: the judge decides each pair; reward sources given as well would be
  // ignored (TRL warns and drops them), so they are refused.
  std::unique_ptr<PairwiseJudge> judge;
  std::unique_ptr<RewardSources> rewards;
  std::shared_ptr<DecoderModel> teacher;
  std::shared_ptr<OffloadedWeights> teacher_offload;
  if (distill) {
    // The teacher: a frozen model of the same vocabulary; the demo's is the demo model itself,
    // and its student a fresh initialisation of the same shape.
    if (oa.teacher_model_name_or_path.empty()) {
      LT_CHECK_INPUT(
          !given_model && !in.dataset_rows && oa.dataset.empty() && oa.model_name_or_path.empty(),
          "distill: --teacher_model_name_or_path is required");
      LT_CHECK_INPUT(!oa.teacher_load_in_4bit && !oa.teacher_load_in_8bit && !oa.teacher_offload &&
                         oa.teacher_model_init_kwargs.empty(),
                     "option --teacher_",
                     oa.teacher_load_in_4bit   ? "load_in_4bit"
                     : oa.teacher_load_in_8bit ? "load_in_8bit"
                     : oa.teacher_offload      ? "offload"
                                               : "model_init_kwargs",
                     " needs --teacher_model_name_or_path");
      teacher = load_sft_model(o).model;
      m.model->init_random(args.seed + 1);
    } else {
      const std::string dir = resolve_model_path(
          oa.teacher_model_name_or_path, "teacher_model_name_or_path", oa.teacher_model_revision);
      // The divergence takes each model's hidden states and head in its own dtype.
      const DType tdt = distill_teacher_dtype(oa.teacher_model_init_kwargs, m.model->dtype(), dir);
      QuantConfig q;
      LT_CHECK_INPUT(!(oa.teacher_load_in_4bit && oa.teacher_load_in_8bit),
                     "options --teacher_load_in_4bit and --teacher_load_in_8bit: choose one");
      q.load_in_4bit = oa.teacher_load_in_4bit;
      q.load_in_8bit = oa.teacher_load_in_8bit;
      q.compute_dtype = tdt;
      if (oa.teacher_offload) {
        OffloadedModel om = load_offloaded(dir, m.model->device(), tdt, true, q);
        teacher = om.model;
        teacher_offload = om.weights;
      } else {
        teacher =
            q.enabled()
                ? load_quantized(dir, m.model->device(), tdt, q)
                : std::shared_ptr<DecoderModel>(DecoderModel::load(dir, m.model->device(), tdt));
      }
    }
    teacher->set_requires_grad(false);
    LT_CHECK_INPUT(teacher->config().vocab_size == m.model->config().vocab_size,
                   "distill: the teacher's vocabulary (", teacher->config().vocab_size,
                   ") must be the student's (", m.model->config().vocab_size, ")");
  } else if (dpo && !oa.judge.empty()) {
    // The built-in task's reward_funcs come from its demo defaults, not from the user.
    bool demo_rewards = false;
    if (!in.dataset_rows && oa.dataset.empty() && oa.rewards.reward_command.empty())
      for (const auto& [key, value] : find_trainer_spec("online_dpo")->demo_defaults)
        if (key == "reward_funcs") demo_rewards = nlohmann::json(oa.rewards.reward_funcs) == value;
    LT_CHECK_INPUT(demo_rewards || (!o.is_set("reward_funcs") && !o.is_set("reward_command")),
                   "option --judge: give a judge or reward sources (--reward_funcs, "
                   "--reward_command), not both");
    // TRL applies the penalty to rewards only; under a judge it would do nothing.
    LT_CHECK_INPUT(oa.missing_eos_penalty == 0.0,
                   "option --missing_eos_penalty: it lowers rewards, and --judge gives none");
    judge = std::make_unique<PairwiseJudge>(oa.judge, oa.rewards.reward_timeout, args.seed,
                                            m.model->device(), m.model->dtype(),
                                            cfg.generation.max_new_tokens);
  } else {
    rewards = std::make_unique<RewardSources>(oa.rewards, cfg.generation.max_new_tokens,
                                              m.model->device(), m.model->dtype());
  }
  const bool need_solution = rewards && rewards->needs_solution();
  std::unique_ptr<TextEncoder> encoder = make_text_encoder(m.tokenizer);
  // No dataset and no rows: the built-in task's prompts.
  const bool builtin = !in.dataset_rows && oa.dataset.empty();
  const bool dataset_completions = distill && cfg.distill_lmbda < 1.0 && !cfg.distill_seq_kd;
  LT_CHECK_INPUT(!builtin || !dataset_completions,
                 "option --lmbda: off-policy batches take the dataset's completions; give a "
                 "--dataset of prompt and completion rows");
  OnlinePrompts data =
      builtin ? builtin_online_prompts(*encoder)
              : load_online_prompts(training_source(o, m, in, ""), *encoder, need_solution);
  if (dataset_completions)
    attach_dataset_completions(data, training_source(o, m, in, ""), *encoder,
                               oa.max_completion_length);
  std::optional<OnlinePrompts> eval;
  if (const std::string ev = eval_data_path(oa, args.eval_strategy); !ev.empty()) {
    // TRL: an evaluation batch holds whole groups of num_generations completions.
    LT_CHECK_INPUT(dpo || args.per_device_eval_batch_size % cfg.num_generations == 0, algorithm,
                   ": per_device_eval_batch_size ", args.per_device_eval_batch_size,
                   " must be a multiple of num_generations ", cfg.num_generations,
                   " (each evaluation batch holds whole groups)");
    eval = load_online_prompts(ev, *encoder, need_solution);
    if (dataset_completions)
      attach_dataset_completions(*eval, ev, *encoder, oa.max_completion_length);
  }
  const PeftArguments peft = peft_table().read(o);
  const std::string base_name = adapter_base_name(m, peft.use_peft, args.output_dir, args.seed);
  run.trainer =
      std::make_unique<OnlineTrainer>(args, m.model, o, m.tokenizer, m.setup.tokenizer_dir,
                                      std::move(data), cfg, std::move(rewards));
  if (eval) run.trainer->set_eval_data(std::move(*eval));
  if (judge) run.trainer->set_judge(std::move(judge));
  if (teacher) run.trainer->set_teacher(std::move(teacher), std::move(teacher_offload));
  run.trainer->set_peft(m.peft, base_name, peft.merge_adapter);
  if (m.quant.enabled()) run.trainer->set_quantized_base(m.quant, m.quant_report);
  RefModelConfig rc = ref_cfg;
  rc.adapter_loaded = !m.setup.embedded && is_adapter_dir(m.setup.model_name_or_path);
  run.trainer->set_reference(rc);
  return run;
}

}  // namespace leantune
