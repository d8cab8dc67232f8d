// Reward trainer: collation of preference pairs, the pairwise loss, the model loader and the
// run. See reward.h.
#include "trainers/reward/reward.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "loaders/text_encoder.h"
#include "models/ref_model.h"
#include "models/score_head.h"
#include "trainers/common/data_options.h"
#include "trainers/common/model_io.h"
#include "trainers/common/option_groups.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/estimate/estimate.h"
#include "trainers/estimate/estimate_reward.h"
#include "trainers/sft/sft.h"

namespace leantune {

namespace fs = std::filesystem;

const OptionTable<RewardArguments>& reward_table() {
  using A = RewardArguments;
  static const OptionTable<ModelSource> source = model_source_table(
      "HF model folder: a *ForSequenceClassification, or a causal LM given a new score head "
      "(empty with no dataset: the built-in demo model)",
      "preference data: JSONL with prompt/chosen/rejected or chosen/rejected, standard or "
      "conversational, optionally a 'margin' number per row");
  static const OptionTable<A> t =
      OptionTable<A>()
          .base(source)
          .integer_or_none("max_length", &A::max_length,
                           "drop pairs whose chosen or rejected sequence is longer (TRL filters, "
                           "it does not cut); none = no limit",
                           1)
          .integer_or_none("pad_to_multiple_of", &A::pad_to_multiple_of,
                           "pad each padded sequence to a multiple of this", 1)
          .flag("padding_free", &A::padding_free,
                "chosen and rejected sequences flat in one varlen batch, no pad tokens")
          .real("center_rewards_coefficient", &A::center_rewards_coefficient,
                "add this times mean((r_chosen + r_rejected)^2) to the loss (0 = off, TRL's "
                "None; 0.01 recommended)")
          .flag("disable_dropout", &A::disable_dropout,
                "no dropout in the model (LoRA dropout included)")
          .also(add_row_data_groups)
          .also(add_model_run_groups);
  return t;
}

Options reward_options(const std::string& command) {
  Options o = reward_table().options(command);
  o.set_default("learning_rate", 1e-4);           // RewardConfig's default
  o.set_default("gradient_checkpointing", true);  // RewardConfig's default
  return o;
}

RewardBatch collate_reward_pairs(const std::vector<RewardPair>& data,
                                 const std::vector<int64_t>& idx, const RewardCollateConfig& cfg) {
  std::vector<std::vector<int32_t>> seqs;
  RewardBatch rb;
  for (int side = 0; side < 2; ++side)
    for (int64_t i : idx) {
      const RewardPair& p = data[static_cast<size_t>(i)];
      seqs.push_back(side == 0 ? p.chosen_ids : p.rejected_ids);
    }
  for (int64_t i : idx) rb.margins.push_back(data[static_cast<size_t>(i)].margin);
  rb.batch = sequences_batch(seqs, cfg.pad_to_multiple_of, cfg.padding_free, cfg.pad_token_id);
  return rb;
}

RewardLossResult reward_loss(const std::vector<double>& chosen, const std::vector<double>& rejected,
                             const std::vector<double>& margins, double center) {
  const size_t n = chosen.size();
  LT_CHECK(n > 0 && rejected.size() == n && (margins.empty() || margins.size() == n),
           "reward_loss: ", n, " chosen, ", rejected.size(), " rejected, ", margins.size(),
           " margins");
  RewardLossResult r;
  r.dchosen.resize(n);
  r.drejected.resize(n);
  const double inv = 1.0 / static_cast<double>(n);
  double loss = 0, center_term = 0, correct = 0, margin = 0;
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = chosen[i] - rejected[i] - (margins.empty() ? 0.0 : margins[i]);
    // -log sigmoid(d) = softplus(-d), and its derivative -sigmoid(-d), in stable forms.
    loss += d >= 0 ? std::log1p(std::exp(-d)) : -d + std::log1p(std::exp(d));
    const double g = -(d >= 0 ? std::exp(-d) / (1 + std::exp(-d)) : 1 / (1 + std::exp(d))) * inv;
    const double s = chosen[i] + rejected[i];
    center_term += s * s;
    const double gc = center * 2 * s * inv;
    r.dchosen[i] = g + gc;
    r.drejected[i] = -g + gc;
    correct += chosen[i] > rejected[i] ? 1 : 0;
    margin += chosen[i] - rejected[i];
    for (double v : {chosen[i], rejected[i]}) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      sum += v;
    }
  }
  r.loss = loss * inv + center * center_term * inv;
  r.metrics = {{"accuracy", correct * inv},
               {"margin", margin * inv},
               {"min_reward", lo},
               {"mean_reward", sum * inv / 2},
               {"max_reward", hi}};
  return r;
}

RewardTrainer::RewardTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model,
                             Options options, std::string tokenizer_dir, RewardData train,
                             std::optional<RewardData> eval, RewardCollateConfig collate,
                             double center_rewards_coefficient, bool disable_dropout)
    : RowBatchTrainer(std::move(args), std::move(model), std::move(options),
                      std::move(tokenizer_dir), static_cast<int64_t>(train.pairs.size()), true,
                      "pairs"),
      train_(std::move(train)),
      collate_(collate),
      center_(center_rewards_coefficient),
      disable_dropout_(disable_dropout) {
  eval_ = std::move(eval);
}

Batch RewardTrainer::next_micro_batch(BatchReport* report) {
  const std::vector<int64_t> idx = batches_.next(comm());
  RewardBatch rb = collate_reward_pairs(train_.pairs, idx, collate_);
  return queue_micro_batch(std::move(rb), &RewardBatch::batch, collate_.padding_free, report);
}

Tensor RewardTrainer::pairs_loss(const RewardBatch& rb, double scale, RewardLossResult* result) {
  const size_t n = static_cast<size_t>(rb.pairs());
  Tensor scores = sequence_scores(*model_, rb.batch, args_.gradient_checkpointing);
  scores = scores.view({static_cast<int64_t>(2 * n)});
  const std::vector<double> s =
      scores.detach().to(Device::cpu(), DType::kF64, MemTag::kOther).to_f64();
  const std::vector<double> chosen(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  const std::vector<double> rejected(s.begin() + static_cast<std::ptrdiff_t>(n), s.end());
  RewardLossResult r = reward_loss(chosen, rejected, rb.margins, center_);
  std::vector<double> grad(r.dchosen);
  grad.insert(grad.end(), r.drejected.begin(), r.drejected.end());
  for (double& g : grad) g *= scale;
  const double value = r.loss * scale;
  if (result) *result = std::move(r);
  return loss_from_sequence_gradient(scores, value, std::move(grad));
}

Tensor RewardTrainer::compute_loss(const Batch& b, double normalizer) {
  LT_CHECK(!pending_.empty(), "reward: compute_loss without a fetched micro-batch");
  RewardBatch rb = std::move(pending_.front());
  pending_.pop_front();
  rb.batch = b;
  // This micro-batch's share of the accumulated batch's pair mean.
  const double scale = static_cast<double>(rb.pairs()) / normalizer;
  RewardLossResult r;
  Tensor loss = pairs_loss(rb, scale, &r);
  window_.add(r.metrics);
  return loss;
}

std::optional<nlohmann::json> RewardTrainer::evaluate() {
  if (!eval_) return std::nullopt;
  // Per batch TRL's reward metrics (accuracy, margin, min/mean/max_reward) and its mean loss.
  return evaluate_in_batches(
      static_cast<int64_t>(eval_->pairs.size()), [&](const std::vector<int64_t>& idx) {
        RewardLossResult r;
        pairs_loss(collate_reward_pairs(eval_->pairs, idx, collate_), 1.0, &r);
        return std::make_pair(r.loss, r.metrics);
      });
}

void RewardTrainer::on_train_begin(MetricsLogger& log) {
  log.message(train_.stats.summary());
  if (eval_) log.message(eval_->stats.summary());
  log.message(std::string("reward: ") + model_->config().architecture + ", pad_token_id " +
              std::to_string(model_->config().pad_token_id.value_or(-1)) +
              (train_.format.has_margin ? ", margins from the data" : "") +
              (center_ > 0 ? ", center_rewards_coefficient " + std::to_string(center_) : ""));
}

nlohmann::json RewardTrainer::technique_savings() const {
  nlohmann::json s = nlohmann::json::object();
  if (collate_.padding_free)
    s["padding_free"] = {
        {"pad_tokens_avoided", padded_tokens_avoided_},
        {"note", "tokens that padding each sequence to the batch's longest would have added"}};
  {
    int64_t longest = 0;
    for (const RewardPair& p : train_.pairs)
      longest = std::max<int64_t>(
          longest, static_cast<int64_t>(std::max(p.chosen_ids.size(), p.rejected_ids.size())));
    EstimateConfig ec = estimate_config(
        model_->config(), args_, peft_.active() ? &peft_.config : nullptr, quant_config_, false, 0,
        model_->device().is_cpu(), max_micro_tokens_, longest);
    ec.resident_before_training = resident_before_training_;
    s["estimate"] = estimate_memory(ec).to_json();
  }
  add_adapter_savings(s, *model_, peft_, quant_config_, quant_report_);
  return s;
}

RewardModelSetup load_reward_model(const Options& o) {
  RewardModelSetup m;
  const ModelSource src = model_source(o);
  m.model_name_or_path = model_folder(src);  // a Hub ID: its snapshot in the local cache
  m.embedded = m.model_name_or_path.empty();
  m.tokenizer_dir = m.embedded ? embedded_data_dir() : m.model_name_or_path;
  LT_CHECK_INPUT(m.embedded || !is_adapter_dir(m.model_name_or_path),
                 "reward: --model_name_or_path ", m.model_name_or_path,
                 " is a PEFT adapter folder; train from a model folder (the base, or a merged "
                 "reward model)");
  const TrainingArguments args = training_table().read(o);
  const Device device = Device::parse(args.device);
  const DType dtype = args.bf16 ? DType::kBF16 : DType::kF32;
  const uint64_t seed = args.seed;
  const PeftArguments peft = peft_arguments(o);
  m.tokenizer = Tokenizer::load(m.tokenizer_dir);
  apply_chat_options(chat_table().read(o), *m.tokenizer);
  const QuantConfig quant = quant_config_from_options(o, dtype);
  LT_CHECK_INPUT(!quant.enabled() || peft.use_peft,
                 "options load_in_4bit / load_in_8bit need use_peft: a quantized base is frozen, "
                 "only adapters (and the score head) train");
  m.base_name = src.model_name_or_path;  // as given: a Hub ID stays an ID
  if (m.embedded) {
    const ModelConfig cfg =
        ModelConfig::load(m.tokenizer_dir + "/config.json").as_sequence_classification(1);
    m.model = std::make_shared<DecoderModel>(cfg, device, dtype);
    m.model->init_random(seed);
    m.converted = true;
  } else {
    SequenceClassifierLoad rep;
    m.model = load_sequence_classifier(m.model_name_or_path, device, dtype, seed, 1, &rep);
    m.converted = rep.converted_from_causal_lm;
  }
  check_tokenizer_fits(m.tokenizer->vocab_size(), m.tokenizer_dir, m.model->config().vocab_size,
                       m.embedded ? m.tokenizer_dir : m.model_name_or_path);
  // TRL: config.pad_token_id = the tokenizer's pad token, else its eos.
  m.model->set_pad_token_id(make_text_encoder(m.tokenizer)->pad_token_id());
  if (quant.enabled()) {
    m.quant_report = quantize_model(*m.model, quant);
    m.quant = quant;
  }
  m.model->set_requires_grad(true);
  if (peft.use_peft) {
    PeftConfig pc = peft.config;
    pc.task_type = "SEQ_CLS";
    if (std::find(pc.modules_to_save.begin(), pc.modules_to_save.end(), "score") ==
        pc.modules_to_save.end())
      pc.modules_to_save.push_back("score");
    m.peft = apply_peft(pc, *m.model, seed);
  }
  return m;
}

RewardRun make_reward_run(const Options& o) {
  check_model_for_dataset("reward", o);
  TrainingArguments args = training_arguments(o);
  const RewardArguments ra = reward_table().read(o);
  const PeftArguments peft = peft_arguments(o);
  prepare_run(args);
  RewardRun run;
  run.model = load_reward_model(o);
  const RewardModelSetup& m = run.model;
  std::string dataset = train_data_path(ra);
  if (dataset.empty()) dataset = m.tokenizer_dir + "/preferences.jsonl";
  std::unique_ptr<TextEncoder> encoder = make_text_encoder(m.tokenizer);
  const DataConfig dc = row_data_config(o, args, ra.max_length.value_or(0));
  auto [train, eval] =
      load_train_and_eval<RewardData>(dataset, eval_data_path(ra, args.eval_strategy), dc, *m.model,
                                      [&](const JsonlSource& src, const DataConfig& c) {
                                        return load_reward_data(src, *encoder, c);
                                      });
  RewardCollateConfig cc;
  cc.padding_free = ra.padding_free;
  cc.pad_to_multiple_of = ra.pad_to_multiple_of.value_or(0);
  cc.pad_token_id = encoder->pad_token_id();
  std::string base_name = m.base_name;
  if (m.embedded && peft.use_peft) {
    // As for sft's demo: the in-memory base (the demo's causal LM, from the seed) is written
    // beside the adapter so that the adapter loads; the score head lives in the adapter.
    const fs::path out = fs::absolute(fs::path(args.output_dir)).lexically_normal();
    const fs::path out_dir = out.filename().empty() ? out.parent_path() : out;
    DecoderModel base(ModelConfig::load(m.tokenizer_dir + "/config.json"), m.model->device(),
                      m.model->dtype());
    base.init_random(static_cast<uint64_t>(args.seed));
    base.save((out_dir / "base_model").string(), DType::kF32);
    copy_tokenizer_files(m.tokenizer_dir, (out_dir / "base_model").string());
    base_name = (out_dir.filename() / "base_model").string();
  }
  run.trainer = std::make_unique<RewardTrainer>(args, m.model, o, m.tokenizer_dir, std::move(train),
                                                std::move(eval), cc, ra.center_rewards_coefficient,
                                                ra.disable_dropout);
  run.trainer->set_peft(m.peft, base_name, peft.merge_adapter);
  if (m.quant.enabled()) run.trainer->set_quantized_base(m.quant, m.quant_report);
  return run;
}

const TrainerSpec& reward_spec() {
  static const TrainerSpec spec{
      "reward",
      "reward modelling on preference pairs (TRL RewardTrainer options); no options: the built-in "
      "demo",
      "pairs",
      reward_options,
      [] {
        auto d = small_demo_defaults("reward");
        d.emplace_back("gradient_checkpointing", false);
        return d;
      }(),
      [](const Options& o) {
        RewardRun r = make_reward_run(o);
        const std::string note = " as " + r.model.model->config().architecture +
                                 (r.model.converted ? " (new score head)" : "");
        return TrainRun{r.model.model, std::move(r.trainer), note, {}};
      },
      nullptr,
      {{"accuracy", 3}, {"margin", 4}},
      run_estimate_reward};
  return spec;
}

RewardModel open_reward_model(const std::string& path, Device device, DType dtype,
                              std::optional<int64_t> pad_token_id) {
  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<PeftSetup> adapters;
  if (is_adapter_dir(path)) {
    const PeftConfig pc = read_adapter_config(path);
    LT_CHECK_INPUT(pc.task_type == "SEQ_CLS", path, "/adapter_config.json: task_type ",
                   pc.task_type, " is not a reward model's (SEQ_CLS)");
    model = load_sequence_classifier(resolve_base_model_path(path), device, dtype, 0, 1);
    adapters = std::make_shared<PeftSetup>(load_adapter(path, *model, 0));
  } else {
    const ModelConfig cfg = ModelConfig::load(path);
    LT_CHECK_INPUT(cfg.sequence_classification, path, ": ", cfg.architecture,
                   " is not a reward model (expected LlamaForSequenceClassification or "
                   "Qwen2ForSequenceClassification, as trainer_bin reward writes)");
    model = load_sequence_classifier(path, device, dtype, 0, 1);
  }
  if (!model->config().pad_token_id && pad_token_id) model->set_pad_token_id(pad_token_id);
  model->set_requires_grad(false);
  return RewardModel(std::move(model), std::move(adapters));
}

}  // namespace leantune
