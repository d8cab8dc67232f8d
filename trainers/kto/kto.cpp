// KTO trainer: unpaired batches with their KL sequences, the loss hook and its metrics. See
// kto.h.
#include "trainers/kto/kto.h"

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
#include "trainers/estimate/estimate_pref.h"

namespace leantune {

namespace fs = std::filesystem;

const OptionTable<KtoArguments>& kto_table() {
  using A = KtoArguments;
  static const OptionTable<ModelSource> source = model_source_table(
      "HF model folder to train (empty with no dataset: the built-in demo model)",
      "unpaired preference data: JSONL with prompt, completion and a boolean label, standard or "
      "conversational");
  static const OptionTable<A> t = OptionTable<A>()
                                      .base(source)
                                      .base(scored_sequences_table())
                                      .also([](Options& o) { kto_loss_table().declare(o); })
                                      .also(add_ref_model_options)
                                      .also(add_row_data_groups)
                                      .also(add_model_run_groups);
  return t;
}

Options kto_options(const std::string& command) {
  Options o = kto_table().options(command);
  o.set_default("learning_rate", 1e-6);  // KTOConfig's default
  return o;
}

namespace {

Batch flat_batch(const std::vector<std::vector<int32_t>>& seqs,
                 const std::vector<std::vector<uint8_t>>& masks) {
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu{0};
  int64_t longest = 0;
  BatchStats st;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t n = static_cast<int64_t>(seqs[s].size());
    for (int64_t t = 0; t < n; ++t) {
      ids.push_back(seqs[s][t]);
      pos.push_back(t);
      labels.push_back(masks[s][t] ? seqs[s][t] : kernels::kIgnoreIndex);
      if (masks[s][t] && t >= 1) ++st.label_tokens;
    }
    st.real_tokens += n;
    longest = std::max(longest, n);
    cu.push_back(cu.back() + static_cast<int32_t>(n));
  }
  st.sequences = static_cast<int64_t>(seqs.size());
  return host_batch(ids, pos, labels, cu, longest, st);
}

}  // namespace

UnpairedBatch collate_unpaired(const std::vector<UnpairedExample>& data,
                               const std::vector<int64_t>& idx, int64_t max_length,
                               const std::string& truncation_mode, bool with_kl) {
  const TruncationMode mode = parse_truncation_mode(truncation_mode);
  UnpairedBatch ub;
  ub.idx = idx;
  for (int64_t i : idx) ub.labels.push_back(data[static_cast<size_t>(i)].label);
  for (int kind = 0; kind < (with_kl ? 2 : 1); ++kind) {
    std::vector<std::vector<int32_t>> seqs;
    std::vector<std::vector<uint8_t>> masks;
    for (size_t k = 0; k < idx.size(); ++k) {
      const UnpairedExample& ex = data[static_cast<size_t>(idx[k])];
      // KL: this prompt with the completion of the example before it (the first: the last).
      const UnpairedExample& comp =
          kind == 0 ? ex : data[static_cast<size_t>(idx[(k + idx.size() - 1) % idx.size()])];
      std::vector<int32_t> ids;
      std::vector<uint8_t> cm;
      build_preference_sequence(ex.prompt_ids, comp.completion_ids, max_length, mode, &ids, &cm);
      seqs.push_back(std::move(ids));
      masks.push_back(std::move(cm));
      (kind == 0 ? ub.matched_keys : ub.kl_keys).push_back(2 * idx[k] + kind);
    }
    (kind == 0 ? ub.matched : ub.kl) = flat_batch(seqs, masks);
  }
  return ub;
}

KtoTrainer::KtoTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
                       std::string tokenizer_dir, UnpairedData train, int64_t max_length,
                       std::string truncation_mode, KtoLossConfig loss, SequenceLogpsOptions logps)
    : RowBatchTrainer(std::move(args), std::move(model), std::move(options),
                      std::move(tokenizer_dir), static_cast<int64_t>(train.examples.size()), false,
                      "examples"),
      train_(std::move(train)),
      max_length_(max_length),
      truncation_mode_(std::move(truncation_mode)),
      loss_(std::move(loss)),
      logps_(logps) {
  logps_.gradient_checkpointing = args_.gradient_checkpointing;
  LT_CHECK_INPUT(!kto_uses_kl(loss_) || args_.per_device_train_batch_size > 1,
                 "option per_device_train_batch_size 1: loss_type kto estimates its KL term from "
                 "the other completions of a micro-batch and needs at least 2 (as TRL)");
}

void KtoTrainer::set_reference(RefModelConfig cfg) {
  ref_ = std::make_unique<ReferenceModel>(std::move(cfg), model_, &peft_);
  if (ref_->mode() != RefMode::kPrecomputed) return;
  // The training micro-batches themselves (their KL rotation depends on them), then the
  // evaluation batches as evaluate() forms them: matched sequences for even b, KL sequences for
  // odd b.
  const bool kl = kto_uses_kl(loss_);
  const int64_t per = kl ? 2 : 1;
  const int64_t train_batches = batches_.global_per_epoch() * per;
  const int64_t ne = eval_ ? static_cast<int64_t>(eval_->examples.size()) : 0;
  const int64_t bs = args_.per_device_eval_batch_size;
  ref_->precompute(
      train_batches + (ne + bs - 1) / bs * per,
      [&](int64_t b) {
        UnpairedBatch ub;
        if (b < train_batches) {
          ub = collate_unpaired(train_.examples, batches_.rows_of(0, b / per), max_length_,
                                truncation_mode_, kl);
        } else {
          const int64_t first = (b - train_batches) / per * bs;
          std::vector<int64_t> idx;
          for (int64_t i = first; i < std::min(ne, first + bs); ++i) idx.push_back(i);
          ub = collate_eval(idx);
        }
        if (kl && b % 2 == 1) return std::make_pair(std::move(ub.kl), std::move(ub.kl_keys));
        return std::make_pair(std::move(ub.matched), std::move(ub.matched_keys));
      },
      logps_);
}

UnpairedBatch KtoTrainer::collate_eval(const std::vector<int64_t>& idx) const {
  UnpairedBatch ub =
      collate_unpaired(eval_->examples, idx, max_length_, truncation_mode_, kto_uses_kl(loss_));
  const int64_t offset = 2 * static_cast<int64_t>(train_.examples.size());
  for (int64_t& k : ub.matched_keys) k += offset;
  for (int64_t& k : ub.kl_keys) k += offset;
  return ub;
}

std::optional<nlohmann::json> KtoTrainer::evaluate() {
  if (!eval_) return std::nullopt;
  return evaluate_in_batches(static_cast<int64_t>(eval_->examples.size()),
                             [&](const std::vector<int64_t>& idx) {
                               KtoLossResult r;
                               batch_loss(collate_eval(idx), 1.0, &r);
                               return std::make_pair(r.loss, r.metrics);
                             });
}

int64_t KtoTrainer::loss_tokens(const Batch& b) const {
  // The examples; under context parallelism the cp group's replicated loss counts once.
  return counts_replicated_loss() ? b.stats.sequences : 0;
}

Batch KtoTrainer::next_micro_batch(BatchReport* report) {
  UnpairedBatch ub = collate_unpaired(train_.examples, batches_.next(data_comm()), max_length_,
                                      truncation_mode_, kto_uses_kl(loss_));
  if (report) {
    report->real_tokens = ub.matched.stats.real_tokens;
    report->pad_tokens = 0;
  }
  Batch b = ub.matched;
  pending_.push_back(std::move(ub));
  return b;
}

Tensor KtoTrainer::compute_loss(const Batch& b, double normalizer) {
  LT_CHECK(!pending_.empty(), "kto: compute_loss without a fetched micro-batch");
  UnpairedBatch ub = std::move(pending_.front());
  pending_.pop_front();
  ub.matched = b;
  const double scale = static_cast<double>(ub.idx.size()) / normalizer;
  KtoLossResult r;
  Tensor loss = batch_loss(ub, scale, &r);
  window_.add(r.metrics);
  return loss;
}

Tensor KtoTrainer::batch_loss(const UnpairedBatch& ub, double scale, KtoLossResult* result) {
  const bool kl = kto_uses_kl(loss_);
  // Under context parallelism this rank scores its zigzag rows through the ring; the reference
  // first (its activations are gone before the policy's graph is built).
  const CpScoring matched(ub.matched, cp_groups_.get(), cp_pad_token_id_);
  const std::vector<double> ref = matched.reference(*ref_, ub.matched_keys, logps_, *model_);
  std::vector<double> ref_kl, pol_kl;
  if (kl) {
    const CpScoring mismatched(ub.kl, cp_groups_.get(), cp_pad_token_id_);
    ref_kl = mismatched.reference(*ref_, ub.kl_keys, logps_, *model_);
    NoGradGuard ng;  // TRL scores the KL sequences without gradient
    pol_kl = mismatched.policy(*model_, logps_).logps.to_f64();
  }
  std::optional<double> kl_override;
  // TRL gathers the data-parallel ranks' estimates and takes their mean (the ranks of a cp
  // group share one micro-batch, hence one estimate).
  Communicator& dp = data_comm();
  if (kl && dp.size() > 1)
    kl_override = dp.all_reduce_scalar(kto_batch_kl(pol_kl, ref_kl)) / dp.size();
  SequenceLogpsOptions po = logps_;
  po.logit_sums = true;
  po.row_stats = true;
  kernels::SequenceLogprobs pol = matched.policy(*model_, po);
  const std::vector<double> lp = pol.logps.to_f64();
  std::vector<KtoExampleTerms> terms;
  for (size_t i = 0; i < lp.size(); ++i)
    terms.push_back(
        {lp[i], ref[i], ub.labels[i], pol.tokens[i], pol.logit_sums[i], pol.entropy_sums[i]});
  KtoLossResult r = kto_loss(loss_, terms, pol_kl, ref_kl, kl_override);
  std::vector<double> grad = r.dlogp;
  for (double& g : grad) g *= scale;
  const double value = counts_replicated_loss() ? r.loss * scale : 0.0;
  if (result) *result = std::move(r);
  return loss_from_sequence_gradient(pol.logps, value, std::move(grad));
}

void KtoTrainer::on_train_begin(MetricsLogger& log) {
  log.message(train_.stats.summary());
  if (eval_) log.message(eval_->stats.summary());
  log.message(std::string("kto: reference ") + ref_mode_name(ref_->mode()) + ", loss " +
              loss_.loss_type + ", beta " + std::to_string(loss_.beta));
}

nlohmann::json KtoTrainer::technique_savings() const {
  nlohmann::json s = nlohmann::json::object();
  s["reference_model"] = ref_->memory_json();
  add_adapter_savings(s, *model_, peft_, quant_config_, quant_report_);
  return s;
}

KtoRun make_kto_run(const Options& o, std::optional<SftModel> model, const RunInputs& in) {
  // The demo model trains on the demo data only; a model given by the embedder (public API)
  // trains on whatever it is given.
  if (!model) check_model_for_dataset("kto", o);
  TrainingArguments args = training_arguments(o);
  const RefModelConfig ref_cfg = ref_model_config(o, args.per_device_eval_batch_size);
  const KtoLossConfig loss = kto_loss_config(o);
  const KtoArguments ka = kto_table().read(o);
  const PeftArguments peft = peft_arguments(o);
  KtoRun run;
  run.model = model ? std::move(*model) : load_sft_model(o);
  prepare_run(args);
  const SftModel& m = run.model;
  const JsonlSource dataset = training_source(o, m, in, "unpaired.jsonl");
  std::unique_ptr<TextEncoder> encoder = make_text_encoder(m.tokenizer);
  DataConfig dc = row_data_config(o, args, ka.max_length.value_or(0));
  dc.truncation_mode = ka.truncation_mode;
  auto [data, eval] =
      load_train_and_eval<UnpairedData>(dataset, eval_data_path(ka, args.eval_strategy), dc,
                                        *m.model, [&](const JsonlSource& src, const DataConfig& c) {
                                          return load_unpaired_data(src, *encoder, c);
                                        });
  SequenceLogpsOptions lo;
  lo.fused = ka.use_liger_loss;
  const std::string base_name = adapter_base_name(m, peft.use_peft, args.output_dir, args.seed);
  run.trainer =
      std::make_unique<KtoTrainer>(args, m.model, o, m.setup.tokenizer_dir, std::move(data),
                                   dc.max_length, dc.truncation_mode, loss, lo);
  run.trainer->set_peft(m.peft, base_name, peft.merge_adapter);
  if (m.quant.enabled()) run.trainer->set_quantized_base(m.quant, m.quant_report);
  run.trainer->set_context_parallel(context_parallel_for(*m.model, args.cp_size, args.comm),
                                    encoder->pad_token_id());
  if (eval) run.trainer->set_eval_data(std::move(*eval));
  RefModelConfig rc = ref_cfg;
  rc.adapter_loaded = !m.setup.embedded && is_adapter_dir(m.setup.model_name_or_path);
  run.trainer->set_reference(rc);
  return run;
}

const TrainerSpec& kto_spec() {
  static const TrainerSpec spec{
      "kto",
      "Kahneman-Tversky optimisation on unpaired preferences (TRL KTOTrainer options); no "
      "options: the built-in demo",
      "examples",
      kto_options,
      small_demo_defaults("kto"),
      [](const Options& o) { return train_run(make_kto_run(o)); },
      [](const Options& o, SftModel m, const RunInputs& in) {
        return train_run(make_kto_run(o, std::move(m), in));
      },
      {{"rewards/margins", 4}, {"kl", 4}},
      [](const std::vector<std::string>& args) { return run_estimate_preference(args, "kto"); },
      true};
  return spec;
}

}  // namespace leantune
