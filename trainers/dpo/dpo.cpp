// DPO trainer: collation of preference pairs, the loss hook and its metrics. See dpo.h.
#include "trainers/dpo/dpo.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "engine/autograd.h"
#include "kernels/cross_entropy.h"
#include "loaders/host_batch.h"
#include "loaders/text_encoder.h"
#include "trainers/common/data_options.h"
#include "trainers/common/model_io.h"
#include "trainers/common/option_groups.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/estimate/estimate.h"
#include "trainers/estimate/estimate_pref.h"

namespace leantune {

namespace fs = std::filesystem;

const OptionTable<DpoArguments>& dpo_table() {
  using A = DpoArguments;
  static const OptionTable<ModelSource> source = model_source_table(
      "HF model folder to train (empty with no dataset: the built-in demo model)",
      "preference data: JSONL with prompt/chosen/rejected or chosen/rejected (implicit prompt), "
      "standard or conversational");
  static const OptionTable<A> t =
      OptionTable<A>()
          .base(source)
          .base(scored_sequences_table())
          .integer_or_none(
              "max_prompt_length", &A::max_prompt_length,
              "the prompt keeps its last this many tokens, before max_length (none = all; "
              "leantune's option, not in TRL 1.16's DPOConfig)",
              1)
          .integer_or_none("max_completion_length", &A::max_completion_length,
                           "chosen and rejected keep their first this many tokens, before "
                           "max_length (none = all; leantune's option, not in TRL 1.16's "
                           "DPOConfig)",
                           1)
          .flag("padding_free", &A::padding_free,
                "chosen and rejected sequences flat in one varlen batch, no pad tokens")
          .integer_or_none("pad_to_multiple_of", &A::pad_to_multiple_of,
                           "pad each padded sequence to a multiple of this", 1)
          .also([](Options& o) { preference_loss_table().declare(o); })
          .also(add_ref_model_options)
          .also(add_row_data_groups)
          .also(add_model_run_groups);
  return t;
}

Options dpo_options(const std::string& command) {
  Options o = dpo_table().options(command);
  o.set_default("learning_rate", 1e-6);  // DPOConfig's default
  return o;
}

PairBatch collate_pairs(const std::vector<PreferenceExample>& data, const std::vector<int64_t>& idx,
                        const DpoDataConfig& cfg) {
  const TruncationMode mode = parse_truncation_mode(cfg.truncation_mode);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<uint8_t>> masks;
  PairBatch pb;
  for (int side = 0; side < 2; ++side)
    for (int64_t i : idx) {
      const PreferenceExample& ex = data[static_cast<size_t>(i)];
      std::vector<int32_t> ids;
      std::vector<uint8_t> cm;
      build_preference_sequence(ex.prompt_ids, side == 0 ? ex.chosen_ids : ex.rejected_ids,
                                cfg.max_length, mode, &ids, &cm);
      int64_t c = 0;
      for (uint8_t m : cm) c += m;
      pb.completion_tokens.push_back(c);
      pb.keys.push_back(2 * i + side);
      seqs.push_back(std::move(ids));
      masks.push_back(std::move(cm));
    }
  int64_t longest = 0;
  for (const auto& s : seqs) longest = std::max<int64_t>(longest, static_cast<int64_t>(s.size()));
  int64_t padded = longest;
  if (cfg.pad_to_multiple_of > 0)
    padded =
        (longest + cfg.pad_to_multiple_of - 1) / cfg.pad_to_multiple_of * cfg.pad_to_multiple_of;
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu{0};
  BatchStats st;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t n = static_cast<int64_t>(seqs[s].size());
    const int64_t len = cfg.padding_free ? n : padded;
    for (int64_t t = 0; t < len; ++t) {
      const bool real = t < n;
      ids.push_back(real ? seqs[s][t] : cfg.pad_token_id);
      pos.push_back(t);
      labels.push_back(real && masks[s][t] ? seqs[s][t] : kernels::kIgnoreIndex);
      if (real && masks[s][t] && t >= 1) ++st.label_tokens;
    }
    st.real_tokens += n;
    st.pad_tokens += len - n;
    cu.push_back(cu.back() + static_cast<int32_t>(len));
  }
  st.sequences = static_cast<int64_t>(seqs.size());
  pb.batch = host_batch(ids, pos, labels, cu, cfg.padding_free ? longest : padded, st);
  return pb;
}

DpoTrainer::DpoTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
                       std::string tokenizer_dir, PreferenceData train, DpoDataConfig data,
                       PreferenceLossConfig loss, SequenceLogpsOptions logps)
    : RowBatchTrainer(std::move(args), std::move(model), std::move(options),
                      std::move(tokenizer_dir), static_cast<int64_t>(train.examples.size()), true,
                      "pairs"),
      train_(std::move(train)),
      data_(std::move(data)),
      loss_(std::move(loss)),
      logps_(logps) {
  logps_.gradient_checkpointing = args_.gradient_checkpointing;
}

void DpoTrainer::set_reference(RefModelConfig cfg) {
  // One pass in data order with the precompute batch size, before any update.
  const int64_t bs = std::max<int64_t>(1, cfg.precompute_batch_size.value_or(1));
  ref_ = std::make_unique<ReferenceModel>(std::move(cfg), model_, &peft_);
  if (ref_->mode() != RefMode::kPrecomputed) return;
  // The training pairs, then the evaluation pairs (TRL precomputes both).
  const int64_t n = static_cast<int64_t>(train_.examples.size());
  const int64_t ne = eval_ ? static_cast<int64_t>(eval_->examples.size()) : 0;
  const int64_t train_batches = (n + bs - 1) / bs;
  ref_->precompute(
      train_batches + (ne + bs - 1) / bs,
      [&](int64_t b) {
        const bool ev = b >= train_batches;
        const int64_t first = (ev ? b - train_batches : b) * bs;
        std::vector<int64_t> idx;
        for (int64_t i = first; i < std::min(ev ? ne : n, first + bs); ++i) idx.push_back(i);
        PairBatch pb = ev ? collate_eval(idx) : collate_pairs(train_.examples, idx, data_);
        return std::make_pair(std::move(pb.batch), std::move(pb.keys));
      },
      logps_);
}

PairBatch DpoTrainer::collate_eval(const std::vector<int64_t>& idx) const {
  PairBatch pb = collate_pairs(eval_->examples, idx, data_);
  for (int64_t& k : pb.keys) k += 2 * static_cast<int64_t>(train_.examples.size());
  return pb;
}

std::optional<nlohmann::json> DpoTrainer::evaluate() {
  if (!eval_) return std::nullopt;
  return evaluate_in_batches(static_cast<int64_t>(eval_->examples.size()),
                             [&](const std::vector<int64_t>& idx) {
                               PreferenceLossResult r;
                               nlohmann::json metrics;
                               pairs_loss(collate_eval(idx), 1.0, &r, &metrics);
                               return std::make_pair(r.loss, metrics);
                             });
}

int64_t DpoTrainer::loss_tokens(const Batch& b) const {
  // The pairs: the trainer sums this over the world, and the ranks of a cp group share their
  // micro-batch and its replicated loss, so only cp rank 0 counts them.
  if (!counts_replicated_loss()) return 0;
  return b.stats.sequences / 2;
}

Batch DpoTrainer::next_micro_batch(BatchReport* report) {
  const std::vector<int64_t> idx = batches_.next(data_comm());
  PairBatch pb = collate_pairs(train_.examples, idx, data_);
  return queue_micro_batch(std::move(pb), &PairBatch::batch, data_.padding_free, report);
}

namespace {

PreferencePairs make_pairs(const std::vector<double>& lp, const std::vector<double>& ref,
                           const std::vector<int64_t>& completion,
                           const std::vector<int64_t>& scored) {
  const size_t n = lp.size() / 2;
  PreferencePairs p;
  p.chosen_logps.assign(lp.begin(), lp.begin() + n);
  p.rejected_logps.assign(lp.begin() + n, lp.end());
  p.ref_chosen_logps.assign(ref.begin(), ref.begin() + n);
  p.ref_rejected_logps.assign(ref.begin() + n, ref.end());
  p.chosen_tokens.assign(completion.begin(), completion.begin() + n);
  p.rejected_tokens.assign(completion.begin() + n, completion.end());
  p.chosen_loss_tokens.assign(scored.begin(), scored.begin() + n);
  return p;
}

}  // namespace

Tensor DpoTrainer::compute_loss(const Batch& b, double normalizer) {
  LT_CHECK(!pending_.empty(), "dpo: compute_loss without a fetched micro-batch");
  PairBatch pb = std::move(pending_.front());
  pending_.pop_front();
  pb.batch = b;
  // This micro-batch's share of the accumulated batch's pair mean.
  const double scale = static_cast<double>(pb.keys.size() / 2) / normalizer;
  nlohmann::json metrics;
  Tensor loss = pairs_loss(pb, scale, nullptr, &metrics);
  window_.add(metrics);
  return loss;
}

Tensor DpoTrainer::pairs_loss(const PairBatch& pb, double scale, PreferenceLossResult* result,
                              nlohmann::json* metrics) {
  const size_t n = pb.keys.size() / 2;
  // Under context parallelism this rank scores its zigzag rows through the ring, the reference
  // first (its activations are gone before the policy's graph is built).
  const CpScoring scoring(pb.batch, cp_groups_.get(), cp_pad_token_id_);
  const std::vector<double> ref = scoring.reference(*ref_, pb.keys, logps_, *model_);
  SequenceLogpsOptions po = logps_;
  po.logit_sums = true;
  po.row_stats = metrics != nullptr;
  kernels::SequenceLogprobs pol = scoring.policy(*model_, po);
  const Tensor& logps = pol.logps;  // the full sequences' log-probabilities, differentiable
  const std::vector<double> lp = logps.to_f64();
  PreferenceLossResult r =
      preference_loss(loss_, make_pairs(lp, ref, pb.completion_tokens, pol.tokens));
  std::vector<double> grad(r.dchosen);
  grad.insert(grad.end(), r.drejected.begin(), r.drejected.end());
  for (double& g : grad) g *= scale;
  double logits_c = 0, logits_r = 0;
  int64_t tok_c = 0, tok_r = 0;
  for (size_t i = 0; i < n; ++i) {
    logits_c += pol.logit_sums[i];
    tok_c += pol.tokens[i];
    logits_r += pol.logit_sums[n + i];
    tok_r += pol.tokens[n + i];
  }
  if (metrics) {
    // TRL's entropy: over the completion tokens of both sides; mean_token_accuracy: the chosen
    // completions' tokens whose target is the top-1 logit.
    double entropy = 0;
    int64_t hits = 0;
    for (size_t i = 0; i < 2 * n; ++i) entropy += pol.entropy_sums[i];
    for (size_t i = 0; i < n; ++i) hits += pol.top1_counts[i];
    const int64_t all = tok_c + tok_r;
    *metrics = {{"rewards/chosen", r.rewards_chosen},
                {"rewards/rejected", r.rewards_rejected},
                {"rewards/accuracies", r.rewards_accuracies},
                {"rewards/margins", r.rewards_margins},
                {"logps/chosen", r.logps_chosen},
                {"logps/rejected", r.logps_rejected},
                {"logits/chosen", tok_c > 0 ? logits_c / static_cast<double>(tok_c) : 0.0},
                {"logits/rejected", tok_r > 0 ? logits_r / static_cast<double>(tok_r) : 0.0},
                {"entropy", all > 0 ? entropy / static_cast<double>(all) : 0.0},
                {"mean_token_accuracy",
                 tok_c > 0 ? static_cast<double>(hits) / static_cast<double>(tok_c) : 0.0}};
  }
  // Every rank of a cp group holds the same loss; the trainer sums it over the world, so it
  // counts on cp rank 0 only (the gradient flows on every rank: each backpropagates its rows).
  const double value = counts_replicated_loss() ? r.loss * scale : 0.0;
  if (result) *result = std::move(r);
  return loss_from_sequence_gradient(logps, value, std::move(grad));
}

PreferenceLossResult DpoTrainer::evaluate_pairs(const std::vector<int64_t>& idx) {
  NoGradGuard ng;
  PreferenceLossResult r;
  peft_.set_training(false);  // evaluation: no adapter dropout
  try {
    pairs_loss(collate_pairs(train_.examples, idx, data_), 1.0, &r, nullptr);
  } catch (...) {
    peft_.set_training(true);
    throw;
  }
  peft_.set_training(true);
  return r;
}

void DpoTrainer::on_train_begin(MetricsLogger& log) {
  log.message(train_.stats.summary());
  if (eval_) log.message(eval_->stats.summary());
  log.message(std::string("dpo: reference ") + ref_mode_name(ref_->mode()) +
              (ref_->mode() == RefMode::kPrecomputed
                   ? std::string(" (computed by ") + ref_mode_name(ref_->source_mode()) + ")"
                   : std::string()) +
              ", loss " +
              [&] {
                std::string s;
                for (const auto& t : loss_.loss_types) s += (s.empty() ? "" : "+") + t;
                return s;
              }() +
              ", beta " + std::to_string(loss_.beta));
}

nlohmann::json DpoTrainer::technique_savings() const {
  nlohmann::json s = nlohmann::json::object();
  s["reference_model"] = ref_->memory_json();
  if (data_.padding_free)
    s["padding_free"] = {
        {"pad_tokens_avoided", padded_tokens_avoided_},
        {"note", "tokens that padding each sequence to the batch's longest would have added"}};
  if (logps_.fused) s["chunked_loss"] = chunked_loss_saving(max_micro_tokens_);
  {
    // The planning estimate for this run's largest micro-batch, beside the measured peak.
    int64_t longest = 0;
    for (const PreferenceExample& ex : train_.examples)
      longest = std::max<int64_t>(
          longest, static_cast<int64_t>(ex.prompt_ids.size() +
                                        std::max(ex.chosen_ids.size(), ex.rejected_ids.size())));
    if (data_.max_length > 0) longest = std::min(longest, data_.max_length);
    EstimateConfig ec = estimate_config(
        model_->config(), args_, peft_.active() ? &peft_.config : nullptr, quant_config_,
        logps_.fused, 0, model_->device().is_cpu(), max_micro_tokens_, longest);
    ec.resident_before_training = resident_before_training_;
    const std::string mode = ref_mode_name(ref_->mode());
    s["estimate"] = estimate_preference(ec, mode, ref_->held_bytes()).to_json();
  }
  add_adapter_savings(s, *model_, peft_, quant_config_, quant_report_);
  return s;
}

DpoRun make_dpo_run(const Options& o) {
  check_model_for_dataset("dpo", o);
  check_dpo_options(o);
  return make_dpo_run(o, load_sft_model(o));
}

void check_dpo_options(const Options& o) {
  (void)training_arguments(o);
  (void)ref_model_config(o, 1);
  (void)preference_loss_config(o);
}

DpoRun make_dpo_run(const Options& o, SftModel model, const RunInputs& in) {
  check_dpo_options(o);
  TrainingArguments args = training_arguments(o);
  const RefModelConfig ref_cfg = ref_model_config(o, args.per_device_eval_batch_size);
  const PreferenceLossConfig loss = preference_loss_config(o);
  const DpoArguments da = dpo_table().read(o);
  const PeftArguments peft = peft_arguments(o);
  prepare_run(args);
  DpoRun run;
  run.model = std::move(model);
  const SftModel& m = run.model;
  const JsonlSource dataset = training_source(o, m, in, "preferences.jsonl");
  std::unique_ptr<TextEncoder> encoder = make_text_encoder(m.tokenizer);

  DataConfig dc = row_data_config(o, args, da.max_length.value_or(0));
  dc.truncation_mode = da.truncation_mode;
  dc.max_prompt_length = da.max_prompt_length.value_or(0);
  dc.max_completion_length = da.max_completion_length.value_or(0);
  auto [data, eval] = load_train_and_eval<PreferenceData>(
      dataset, eval_data_path(da, args.eval_strategy), dc, *m.model,
      [&](const JsonlSource& src, const DataConfig& c) {
        return load_preference_data(src, *encoder, c);
      });

  DpoDataConfig dd;
  dd.max_length = dc.max_length;
  dd.truncation_mode = dc.truncation_mode;
  dd.padding_free = da.padding_free;
  dd.pad_to_multiple_of = da.pad_to_multiple_of.value_or(0);
  dd.pad_token_id = encoder->pad_token_id();
  auto cp_groups = context_parallel_for(*m.model, args.cp_size, args.comm);
  SequenceLogpsOptions lo;
  lo.fused = da.use_liger_loss;
  const std::string base_name = adapter_base_name(m, peft.use_peft, args.output_dir, args.seed);
  run.trainer = std::make_unique<DpoTrainer>(args, m.model, o, m.setup.tokenizer_dir,
                                             std::move(data), dd, loss, lo);
  run.trainer->set_peft(m.peft, base_name, peft.merge_adapter);
  if (m.quant.enabled()) run.trainer->set_quantized_base(m.quant, m.quant_report);
  run.trainer->set_context_parallel(cp_groups, dd.pad_token_id);
  if (eval) run.trainer->set_eval_data(std::move(*eval));
  RefModelConfig rc = ref_cfg;
  rc.adapter_loaded = !m.setup.embedded && is_adapter_dir(m.setup.model_name_or_path);
  run.trainer->set_reference(rc);
  return run;
}

const TrainerSpec& dpo_spec() {
  static const TrainerSpec spec{
      "dpo",
      "direct preference optimisation (TRL DPOTrainer options); no options: the built-in demo",
      "pairs",
      dpo_options,
      small_demo_defaults("dpo"),
      [](const Options& o) { return train_run(make_dpo_run(o)); },
      [](const Options& o, SftModel m, const RunInputs& in) {
        return train_run(make_dpo_run(o, std::move(m), in));
      },
      {{"rewards/accuracies", 3}, {"rewards/margins", 4}},
      [](const std::vector<std::string>& args) { return run_estimate_preference(args, "dpo"); },
      true};
  return spec;
}

}  // namespace leantune
