// The sft trainer, its options and run, the model loading every trainer shares, and the memory
// report (see sft.h).
#include "trainers/sft/sft.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "dist/context_parallel.h"
#include "engine/autograd.h"
#include "engine/comm.h"
#include "engine/mem_phase.h"
#include "loaders/text_encoder.h"
#include "models/generate.h"
#include "models/quantize_model.h"
#include "models/ref_model.h"
#include "trainers/common/data_options.h"
#include "trainers/common/model_io.h"
#include "trainers/common/optim_options.h"
#include "trainers/common/option_groups.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/estimate/estimate.h"

namespace leantune {

namespace fs = std::filesystem;

std::string embedded_data_dir() {
  if (const char* env = std::getenv("LEANTUNE_DATA_DIR")) return std::string(env) + "/embedded";
  // An installed libleantune (lib/libleantune.so) finds it in share/leantune/embedded.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&embedded_data_dir), &info) != 0 && info.dli_fname) {
    const fs::path installed =
        fs::path(info.dli_fname).parent_path().parent_path() / "share/leantune/embedded";
    if (fs::exists(installed / "config.json")) return installed.string();
  }
#ifdef LEANTUNE_SOURCE_DIR
  if (fs::exists(std::string(LEANTUNE_SOURCE_DIR) + "/data/embedded/config.json"))
    return std::string(LEANTUNE_SOURCE_DIR) + "/data/embedded";
#endif
  LT_THROW(ErrorKind::kInput,
           "the embedded default run's data folder was not found; set LEANTUNE_DATA_DIR to the "
           "repository's data/ folder, or pass --model_name_or_path and --dataset");
}

const OptionTable<SftArguments>& sft_table() {
  using A = SftArguments;
  static const OptionTable<ModelSource> source = model_source_table(
      "HF model folder to fine-tune (empty with no dataset: the built-in demo model)",
      "training data: a JSONL file in a TRL format");
  static const OptionTable<A> t =
      OptionTable<A>()
          .base(source)
          .integer_or_none("max_length", &A::max_length,
                           "truncate (or pack) sequences to this many tokens; none = no limit", 1)
          .text("truncation_mode", &A::truncation_mode, "which end of a too-long sequence is kept",
                {"keep_start", "keep_end"})
          .flag("packing", &A::packing, "pack examples into sequences of max_length tokens")
          .also([](Options& o) { packing_table().declare(o); })
          .flag_or_none("padding_free", &A::padding_free,
                        "flat varlen batches without pad tokens (default: on with bfd packing)")
          .integer_or_none("pad_to_multiple_of", &A::pad_to_multiple_of,
                           "pad each batch to a multiple of this", 1)
          .also(add_data_groups)
          .flag("use_liger_kernel", &A::use_liger_kernel,
                "fused chunked linear cross-entropy: the [tokens x vocab] logits never exist")
          .also(add_model_run_groups);
  return t;
}

Options sft_options(const std::string& command) { return sft_table().options(command); }

SftTrainer::SftTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
                       std::shared_ptr<Tokenizer> tokenizer, std::string tokenizer_dir,
                       std::shared_ptr<DataLoader> train, std::shared_ptr<DataLoader> eval,
                       DataStats train_stats, bool fused_loss)
    : Trainer(std::move(args), std::move(model), std::move(options)),
      tokenizer_(std::move(tokenizer)),
      train_(std::move(train)),
      eval_(std::move(eval)),
      train_stats_(std::move(train_stats)),
      fused_loss_(fused_loss) {
  tokenizer_dir_ = std::move(tokenizer_dir);
}

Batch SftTrainer::next_micro_batch(BatchReport* report) {
  // What padding every row to the batch's longest row would have cost (padding-free's saving).
  // The loader rolls over to the next epoch when the current one is exhausted.
  const bool rollover = train_->step_in_epoch() >= train_->batches_per_epoch();
  const int64_t epoch = train_->epoch() + (rollover ? 1 : 0);
  const int64_t step = rollover ? 0 : train_->step_in_epoch();
  const std::vector<int64_t> units = train_->sampler().batch(epoch, step);
  int64_t longest = 0, real = 0;
  for (int64_t u : units) {
    const int64_t n = static_cast<int64_t>(train_->unit_row(u).input_ids.size());
    longest = std::max(longest, n);
    real += n;
  }
  Batch b = train_->next(report);
  if (train_->padding_free())
    padded_tokens_avoided_ += longest * static_cast<int64_t>(units.size()) - real;
  max_micro_tokens_ = std::max(max_micro_tokens_, b.num_tokens());
  max_sequence_tokens_ = std::max(max_sequence_tokens_, b.max_seqlen);
  return b;
}

int64_t SftTrainer::loss_tokens(const Batch& b) const {
  // Context parallel: this rank's targets; the trainer's sum over the world counts each once.
  return context_parallel()
             ? context_parallel_label_tokens(b, cp_groups_->cp_size, cp_groups_->cp_rank)
             : b.stats.label_tokens;
}

Tensor SftTrainer::compute_loss(const Batch& b, double normalizer) {
  ForwardOptions fo;
  fo.normalizer = normalizer;
  fo.gradient_checkpointing = args_.gradient_checkpointing;
  fo.fused_loss = fused_loss_;
  fo.row_grad_sink = row_grad_sink();
  fo.row_stats = true;
  if (!context_parallel()) {
    ForwardResult r = model_->forward(b, fo);
    add_row_stats(r);
    return r.loss;
  }
  ContextParallelBatch split = split_context_parallel(b, cp_groups_->cp_size, cp_groups_->cp_rank,
                                                      cp_pad_token_id_, cp_groups_->cp.get());
  fo.context_parallel = split.context;
  fo.labels_shifted = true;
  ForwardResult r = model_->forward(split.local, fo);
  add_row_stats(r);
  return r.loss;
}

void SftTrainer::add_row_stats(const ForwardResult& r) {
  if (!r.row_stats) return;
  double entropy = r.row_stats->entropy_sum;
  int64_t hits = r.row_stats->top1, tokens = r.label_tokens;
  if (context_parallel()) {
    // Each rank of the group holds its rows' sums: the micro-batch's are their totals.
    Communicator& cp = *cp_groups_->cp;
    entropy = cp.all_reduce_scalar(entropy);
    hits = cp.all_reduce_int(hits);
    tokens = cp.all_reduce_int(tokens);
  }
  const double n = static_cast<double>(tokens);
  window_.add({{"entropy", tokens > 0 ? entropy / n : 0.0},
               {"mean_token_accuracy", tokens > 0 ? static_cast<double>(hits) / n : 0.0}});
}

std::optional<nlohmann::json> SftTrainer::evaluate() {
  if (!eval_) return std::nullopt;
  // TRL's SFT evaluation: per batch the mean loss over its label tokens, the mean entropy of
  // their predicted distributions and the share whose target is the top-1 token. One chunked
  // LM-head pass gives all three (kernels/sequence_logprobs.h); a soft-capped model (Gemma 2)
  // is scored by its own fused loss, which gives the loss alone.
  const bool stats = model_->logit_softcap() == 0;
  return evaluate_in_batches(eval_->num_units(), [&](const std::vector<int64_t>& units) {
    Batch b = eval_->collate_units(units, nullptr);
    double nll = 0;
    int64_t tokens = 0;
    nlohmann::json metrics = nlohmann::json::object();
    if (stats) {
      SequenceLogpsOptions so;
      so.fused = fused_loss_;
      so.row_stats = true;
      // Under context parallelism each rank scores its zigzag rows through the ring and the
      // sums are the whole sequences' (CpScoring).
      const CpScoring scoring(b, cp_groups_.get(), cp_pad_token_id_);
      const kernels::SequenceLogprobs r = scoring.policy(*model_, so);
      const std::vector<double> lp = r.logps.to_f64();
      double entropy = 0;
      int64_t hits = 0;
      for (size_t i = 0; i < lp.size(); ++i) {
        nll -= lp[i];
        tokens += r.tokens[i];
        entropy += r.entropy_sums[i];
        hits += r.top1_counts[i];
      }
      const double n = static_cast<double>(std::max<int64_t>(tokens, 1));
      metrics = {{"entropy", tokens > 0 ? entropy / n : 0.0},
                 {"mean_token_accuracy", tokens > 0 ? static_cast<double>(hits) / n : 0.0}};
    } else {
      ForwardOptions fo;
      fo.normalizer = 1.0;  // the sum of token NLLs
      fo.fused_loss = fused_loss_;
      if (context_parallel()) {
        ContextParallelBatch split = split_context_parallel(
            b, cp_groups_->cp_size, cp_groups_->cp_rank, cp_pad_token_id_, cp_groups_->cp.get());
        fo.context_parallel = split.context;
        fo.labels_shifted = true;
        b = std::move(split.local);
      }
      ForwardResult r = model_->forward(b, fo);
      nll = r.loss.item();
      tokens = r.label_tokens;
      if (context_parallel()) {
        nll = cp_groups_->cp->all_reduce_scalar(nll);
        tokens = cp_groups_->cp->all_reduce_int(tokens);
      }
    }
    // TRL clamps the token count at 1: a batch without label tokens has loss 0.
    return std::make_pair(nll / static_cast<double>(std::max<int64_t>(tokens, 1)), metrics);
  });
}

double SftTrainer::epoch_progress() const {
  const double per = static_cast<double>(std::max<int64_t>(train_->batches_per_epoch(), 1));
  return static_cast<double>(train_->epoch()) + static_cast<double>(train_->step_in_epoch()) / per;
}

nlohmann::json SftTrainer::data_state() const {
  return nlohmann::json::parse(train_->state().to_json());
}

void SftTrainer::set_data_state(const nlohmann::json& s) {
  train_->set_state(LoaderState::from_json(s.dump()));
}

void SftTrainer::on_train_begin(MetricsLogger& log) {
  log.message(train_stats_.summary());
  log.message(train_->summary());
}

nlohmann::json SftTrainer::technique_savings() const {
  nlohmann::json s = nlohmann::json::object();
  if (train_->padding_free())
    s["padding_free"] = {
        {"pad_tokens_avoided", padded_tokens_avoided_},
        {"note", "tokens that padding each micro-batch to its longest row would have added"}};
  if (fused_loss_) s["chunked_loss"] = chunked_loss_saving(max_micro_tokens_);
  {
    // The planning estimate for this run's largest micro-batch, beside the measured peak.
    int64_t longest = 0;
    for (int64_t u = 0; u < train_->num_units(); ++u)
      longest =
          std::max<int64_t>(longest, static_cast<int64_t>(train_->unit_row(u).input_ids.size()));
    EstimateConfig ec = estimate_config(
        model_->config(), args_, peft_.active() ? &peft_.config : nullptr, quant_config_,
        fused_loss_, 0, model_->device().is_cpu(), max_micro_tokens_, longest);
    ec.resident_before_training = resident_before_training_;
    ec.attention_seqlen = max_sequence_tokens_;
    ec.world_size = comm().size();
    ec.row_block_updates = args_.optimizer_in_backward && optim_updates_rows(args_.optim);
    s["estimate"] = estimate_memory(ec).to_json();
  }
  add_adapter_savings(s, *model_, peft_, quant_config_, quant_report_);
  return s;
}

const std::vector<std::string>& sft_model_option_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"model_name_or_path", "device", "bf16"};
    for (const auto& group : {chat_table().names(), peft_table().names(),
                              peft_config_table().names(), quant_table().names()})
      n.insert(n.end(), group.begin(), group.end());
    n.erase(std::find(n.begin(), n.end(), "merge_adapter"));  // a property of the run's output
    return n;
  }();
  return names;
}

SftModel load_sft_model(const Options& o) {
  SftModel m;
  SftSetup& setup = m.setup;
  const ModelSource src = model_source(o);
  setup.model_name_or_path = model_folder(src);  // a Hub ID: its snapshot in the local cache
  setup.embedded = setup.model_name_or_path.empty();
  if (setup.embedded) {
    const std::string dir = embedded_data_dir();
    setup.tokenizer_dir = dir;
    setup.model_config = dir + "/config.json";
  } else {
    setup.tokenizer_dir = setup.model_name_or_path;
    // An adapter folder without tokenizer files uses its base model's.
    if (is_adapter_dir(setup.model_name_or_path) &&
        !fs::exists(fs::path(setup.model_name_or_path) / "tokenizer.json"))
      setup.tokenizer_dir = resolve_base_model_path(setup.model_name_or_path);
  }
  // Read without training_arguments' checks: the API loads a model before any run is set up.
  const TrainingArguments args = training_table().read(o);
  const Device device = Device::parse(args.device);
  const DType dtype = args.bf16 ? DType::kBF16 : DType::kF32;
  const uint64_t seed = args.seed;
  m.tokenizer = Tokenizer::load(setup.tokenizer_dir);
  apply_chat_options(chat_table().read(o), *m.tokenizer);

  // QLoRA: the base is quantized while loading (before adapters and the optimizer exist, so
  // nothing keeps the dense weights alive).
  const QuantConfig quant = quant_config_from_options(o, dtype);
  const bool adapter_dir = !setup.embedded && is_adapter_dir(setup.model_name_or_path);
  LT_CHECK_INPUT(!quant.enabled() || peft_table().read(o).use_peft || adapter_dir,
                 "options load_in_4bit / load_in_8bit need use_peft: a quantized base is frozen, "
                 "only adapters train");
  // adapter_config.json names the base as given (a Hub ID stays an ID, as PEFT writes it).
  m.base_name = src.model_name_or_path;
  if (setup.embedded) {
    m.model = std::make_shared<DecoderModel>(ModelConfig::load(setup.model_config), device, dtype);
    m.model->init_random(seed);
    if (quant.enabled()) m.quant_report = quantize_model(*m.model, quant);
    m.model->set_requires_grad(true);
    m.peft = apply_peft_options(o, *m.model, seed);
  } else if (adapter_dir) {
    // Continue training a PEFT adapter: its base is loaded and frozen, the adapter trains on.
    m.base_name = resolve_base_model_path(setup.model_name_or_path);
    if (quant.enabled()) {
      m.model = load_quantized(m.base_name, device, dtype, quant, &m.quant_report);
      m.peft = load_adapter(setup.model_name_or_path, *m.model, seed);
    } else {
      m.model = load_model_or_adapter(setup.model_name_or_path, device, dtype, &m.peft, seed);
    }
    m.peft.set_training(true);
  } else {
    m.model = quant.enabled()
                  ? load_quantized(setup.model_name_or_path, device, dtype, quant, &m.quant_report)
                  : DecoderModel::load(setup.model_name_or_path, device, dtype);
    m.model->set_requires_grad(true);
    m.peft = apply_peft_options(o, *m.model, seed);
  }
  if (quant.enabled()) m.quant = quant;
  check_tokenizer_fits(m.tokenizer->vocab_size(), setup.tokenizer_dir, m.model->config().vocab_size,
                       setup.embedded ? embedded_data_dir()
                       : adapter_dir  ? m.base_name
                                      : setup.model_name_or_path);
  return m;
}

JsonlSource training_source(const Options& o, const SftModel& m, const RunInputs& in,
                            const std::string& demo_file) {
  const std::string dataset = train_data_path(model_source(o));
  if (in.dataset_rows) {
    LT_CHECK_INPUT(dataset.empty(), "option dataset ", dataset,
                   ": the training rows are also given in memory; give one of them");
    return JsonlSource("dataset_rows", in.dataset_rows);
  }
  if (!dataset.empty()) return JsonlSource(dataset);
  LT_CHECK_INPUT(m.setup.embedded, o.command(),
                 ": --dataset is required when --model_name_or_path is given");
  return JsonlSource(m.setup.tokenizer_dir + "/" + demo_file);
}

SftRun make_sft_run(const Options& o, const SftModel& m, const RunInputs& in) {
  TrainingArguments args = training_arguments(o);
  const SftArguments sa = sft_table().read(o);
  const PeftArguments peft = peft_arguments(o);
  prepare_run(args);
  SftRun run;
  run.setup = m.setup;
  SftSetup& setup = run.setup;
  const JsonlSource source = training_source(o, m, in, "stories.jsonl");
  setup.dataset = source.path;
  run.tokenizer = m.tokenizer;
  run.model = m.model;
  const std::string base_name = adapter_base_name(m, peft.use_peft, args.output_dir, args.seed);
  std::unique_ptr<TextEncoder> encoder = make_text_encoder(run.tokenizer);
  run.eos_token_id = encoder->eos_token_id();

  DataConfig dc;
  read_dataset_options(o, &dc);
  dc.max_length = sa.max_length.value_or(0);
  dc.truncation_mode = sa.truncation_mode;
  dc.packing = sa.packing;
  packing_table().read_into(o, dc);
  dc.padding_free = sa.padding_free;
  dc.pad_to_multiple_of =
      context_parallel_pad_multiple(args.cp_size, sa.pad_to_multiple_of.value_or(0));
  dc.per_device_train_batch_size = args.per_device_train_batch_size;
  dc.seed = args.seed;
  validate_data_config(dc);
  warn_beyond_positions(dc.max_length, *run.model);

  SftData train = load_sft_data(source, encoder.get(), dc);
  auto train_examples = std::make_shared<TokenizedDataset>(std::move(train.examples));
  // Data parallel: every rank takes its own shard of the micro-batches (data_loader.h); the
  // ranks of a context-parallel group share theirs.
  // The ring attention (kernels/ring_attention.h) runs on CPU ranks over MPI in f32, and on CUDA
  // ranks over NCCL in f32, bf16 or f16 (the CUDA path has not run on a GPU yet).
  auto cp_groups = context_parallel_for(*run.model, args.cp_size, args.comm, in.comm.get());
  auto loader = std::make_shared<DataLoader>(train_examples, dc, encoder->pad_token_id(),
                                             cp_groups->dp_rank, cp_groups->dp_size);
  std::shared_ptr<DataLoader> eval;
  const std::string eval_path = eval_data_path(sa, args.eval_strategy);
  if (!eval_path.empty()) {
    DataConfig ec = dc;
    ec.shuffle = false;
    ec.per_device_train_batch_size = args.per_device_eval_batch_size;
    SftData ev = load_sft_data(eval_path, encoder.get(), ec);
    eval = std::make_shared<DataLoader>(std::make_shared<TokenizedDataset>(std::move(ev.examples)),
                                        ec, encoder->pad_token_id());
  }
  run.trainer = std::make_unique<SftTrainer>(args, run.model, o, run.tokenizer, setup.tokenizer_dir,
                                             loader, eval, train.stats, sa.use_liger_kernel);
  run.trainer->set_communicator(in.comm);
  run.trainer->set_peft(m.peft, base_name, peft.merge_adapter);
  run.trainer->set_context_parallel(cp_groups, encoder->pad_token_id());
  if (m.quant.enabled()) run.trainer->set_quantized_base(m.quant, m.quant_report);
  return run;
}

SftRun make_sft_run(const Options& o) {
  check_model_for_dataset("sft", o);
  return make_sft_run(o, load_sft_model(o));
}

std::function<std::string()> sft_demo_sample(const SftModel& m, const std::string& chat_template) {
  const int32_t eos = make_text_encoder(m.tokenizer, chat_template)->eos_token_id();
  return [model = m.model, tokenizer = m.tokenizer, peft = m.peft, eos]() mutable {
    const std::string prompt = "One sunny day, Mia";
    GenerationConfig g;
    g.max_new_tokens = 48;
    g.eos_token_ids = {eos};
    peft.set_training(false);
    const GenerationResult r = generate(*model, {tokenizer->encode(prompt, true)}, g);
    peft.set_training(true);
    return "sample: " + prompt + tokenizer->decode(r.tokens[0], true);
  };
}

const TrainerSpec& sft_spec() {
  static const TrainerSpec spec{
      "sft",
      "supervised fine-tuning (TRL SFTTrainer options); no options: the built-in demo",
      "rows",
      sft_options,
      {{"max_length", 256},
       {"packing", true},
       {"per_device_train_batch_size", 8},
       {"learning_rate", 3e-3},
       {"lr_scheduler_type", "cosine"},
       {"warmup_steps", 0.05},
       {"max_steps", 120},
       {"logging_steps", 10},
       {"save_steps", 0},
       {"weight_decay", 0.01},
       {"output_dir", "trainer_output/embedded"}},
      [](const Options& o) {
        check_model_for_dataset("sft", o);
        (void)training_arguments(o);  // option combinations are refused before anything loads
        const SftModel m = load_sft_model(o);
        SftRun r = make_sft_run(o, m);
        TrainRun run{r.model, std::move(r.trainer), "", {}};
        if (m.setup.embedded && model_source(o).dataset.empty())
          run.demo_sample = sft_demo_sample(m, chat_table().read(o).chat_template);
        return run;
      },
      [](const Options& o, SftModel m, const RunInputs& in) {
        SftRun r = make_sft_run(o, m, in);
        return TrainRun{r.model, std::move(r.trainer), "", {}};
      },
      {},
      nullptr,
      true};
  return spec;
}

std::string adapter_base_name(const SftModel& m, bool use_peft, const std::string& output_dir,
                              uint64_t seed) {
  if (!m.setup.embedded || !use_peft) return m.base_name;
  const fs::path out = fs::absolute(fs::path(output_dir)).lexically_normal();
  const fs::path out_dir = out.filename().empty() ? out.parent_path() : out;
  DecoderModel base(ModelConfig::load(m.setup.model_config), m.model->device(), m.model->dtype());
  base.init_random(seed);
  base.save((out_dir / "base_model").string(), DType::kF32);
  copy_tokenizer_files(m.setup.tokenizer_dir, (out_dir / "base_model").string());
  return (out_dir.filename() / "base_model").string();
}

}  // namespace leantune
