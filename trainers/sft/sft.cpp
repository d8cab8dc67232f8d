// The sft trainer, its options and run, the model loading every trainer shares, and the memory
// report (see sft.h).
#include "trainers/sft/sft.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "engine/autograd.h"
#include "engine/comm.h"
#include "engine/mem_phase.h"
#include "loaders/text_encoder.h"
#include "models/quantize_model.h"
#include "models/ref_model.h"
#include "trainers/common/data_options.h"
#include "trainers/common/model_io.h"
#include "trainers/common/optim_options.h"
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

Options sft_options(const std::string& command) {
  Options o(command);
  o.add_string("model_name_or_path", "",
               "HF model folder to fine-tune (empty with no dataset: the built-in demo model)");
  o.add_string("dataset", "", "training data: a JSONL file in a TRL format");
  o.add_string("eval_dataset", "", "evaluation data (JSONL), evaluated every eval_steps");
  o.add_int_or_none("max_length", 1024,
                    "truncate (or pack) sequences to this many tokens; none = no limit", 1);
  o.add_string("truncation_mode", "keep_start", "which end of a too-long sequence is kept",
               {"keep_start", "keep_end"});
  o.add_bool("packing", false, "pack examples into sequences of max_length tokens");
  o.add_string("packing_strategy", "bfd", "how examples are packed",
               {"bfd", "bfd_split", "wrapped"});
  o.add_int("packing_window", 0,
            "examples packed together (0 = the whole dataset; 1000 = TRL's chunks)", 0);
  o.add_bool_or_none("padding_free", std::nullopt,
                     "flat varlen batches without pad tokens (default: on with bfd packing)");
  o.add_int_or_none("pad_to_multiple_of", std::nullopt, "pad each batch to a multiple of this", 1);
  add_dataset_options(o);
  add_chat_options(o);
  o.add_bool("use_liger_kernel", true,
             "fused chunked linear cross-entropy: the [tokens x vocab] logits never exist");
  add_peft_options(o);
  add_quant_options(o);
  add_training_options(o);
  return o;
}

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
  if (!context_parallel()) return model_->forward(b, fo).loss;
  ContextParallelBatch split = split_context_parallel(b, cp_groups_->cp_size, cp_groups_->cp_rank,
                                                      cp_pad_token_id_, cp_groups_->cp.get());
  fo.context_parallel = split.context;
  fo.labels_shifted = true;
  return model_->forward(split.local, fo).loss;
}

std::optional<double> SftTrainer::evaluate() {
  if (!eval_) return std::nullopt;
  NoGradGuard ng;
  MemPhaseGuard phase(MemPhaseKind::kEvaluation);
  peft_.set_training(false);
  double nll = 0;
  int64_t tokens = 0;
  std::vector<int64_t> all(eval_->num_units());
  for (int64_t i = 0; i < eval_->num_units(); ++i) all[i] = i;
  const int64_t bs = args_.per_device_eval_batch_size;
  for (int64_t start = 0; start < eval_->num_units(); start += bs) {
    std::vector<int64_t> units(all.begin() + start,
                               all.begin() + std::min<int64_t>(start + bs, eval_->num_units()));
    Batch b = eval_->collate_units(units, nullptr);
    ForwardOptions fo;
    fo.normalizer = 1.0;  // sum of token NLLs
    fo.fused_loss = fused_loss_;
    if (context_parallel()) {
      // Each rank of the group scores its zigzag rows through the ring, as in training.
      ContextParallelBatch split = split_context_parallel(
          b, cp_groups_->cp_size, cp_groups_->cp_rank, cp_pad_token_id_, cp_groups_->cp.get());
      fo.context_parallel = split.context;
      fo.labels_shifted = true;
      b = std::move(split.local);
    }
    ForwardResult r = model_->forward(b, fo);
    nll += r.loss.item();
    tokens += r.label_tokens;
  }
  if (context_parallel()) {
    nll = cp_groups_->cp->all_reduce_scalar(nll);
    tokens = cp_groups_->cp->all_reduce_int(tokens);
  }
  peft_.set_training(true);
  return tokens > 0 ? nll / static_cast<double>(tokens) : 0.0;
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
  if (fused_loss_) {
    const int64_t v = model_->config().vocab_size;
    s["chunked_loss"] = {{"largest_micro_batch_tokens", max_micro_tokens_},
                         {"vocab_size", v},
                         {"logits_bytes_not_materialised", max_micro_tokens_ * v * 4 * 2},
                         {"note", "f32 logits and their gradient for the largest micro-batch"}};
  }
  if (args_.gradient_checkpointing)
    s["gradient_checkpointing"] = {
        {"note", "only each layer's input is kept between forward and backward"}};
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

std::string format_memory_report(const nlohmann::json& r) {
  std::string out;
  char line[256];
  const std::string phase = r.value("phase_at_peak", "");
  std::snprintf(line, sizeof line, "memory report (%s): peak allocated %s%s%s, peak reserved %s\n",
                r.value("device", "?").c_str(),
                format_bytes(r.value("peak_allocated", int64_t{0})).c_str(),
                phase.empty() ? "" : " during ", phase.c_str(),
                format_bytes(r.value("peak_reserved", int64_t{0})).c_str());
  out += line;
  if (r.contains("blas")) out += "  " + r["blas"].get<std::string>() + "\n";
  if (r.value("peak_rss", int64_t{0}) > 0) {
    std::snprintf(line, sizeof line,
                  "  peak RSS %s (the process's resident memory: the host allocator's segments "
                  "on the CPU, plus code, BLAS buffers, tokenizer and data)\n",
                  format_bytes(r.value("peak_rss", int64_t{0})).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-18s %12s %12s\n", "by tag", "at the peak", "own peak");
  out += line;
  const std::pair<const char*, const char*> cats[] = {
      {"param", "params"},           {"grad", "grads"},          {"optimizer", "optimizer states"},
      {"activation", "activations"}, {"workspace", "workspace"}, {"kv_cache", "kv cache"},
      {"comm", "communication"},     {"other", "other"}};
  for (const auto& [tag, label] : cats) {
    const int64_t v = r["peak_by_tag"].value(tag, int64_t{0});
    const int64_t at =
        r.contains("at_peak_by_tag") ? r["at_peak_by_tag"].value(tag, int64_t{0}) : v;
    std::snprintf(line, sizeof line, "  %-18s %12s %12s\n", label, format_bytes(at).c_str(),
                  format_bytes(v).c_str());
    out += line;
  }
  if (r.contains("distributed")) {
    const auto& d = r["distributed"];
    char line[320];
    std::snprintf(line, sizeof line,
                  "  data parallel: %d ranks (%s, zero_stage %d%s), per update %.1f ms: compute "
                  "%.1f ms, communication %.1f ms, exposed %.1f ms\n",
                  d["world_size"].get<int>(), d["backend"].get<std::string>().c_str(),
                  d["zero_stage"].get<int>(),
                  d.contains("cp_size") ? (", cp_size " + std::to_string(d["cp_size"].get<int>()) +
                                           " (ring attention counted as compute)")
                                              .c_str()
                                        : "",
                  1e3 * d["step_seconds"].get<double>(), 1e3 * d["compute_seconds"].get<double>(),
                  1e3 * d["comm_seconds"].get<double>(),
                  1e3 * d["exposed_comm_seconds"].get<double>());
    out += line;
    if (d.contains("zero3")) {
      const auto& z = d["zero3"];
      std::snprintf(line, sizeof line,
                    "  zero_stage 3: this rank's parameter slices %s (%lld B), whole small "
                    "parameters %s (%lld B), gathered units at most %s (%lld B), %lld units "
                    "prefetched (%lld unused)\n",
                    format_bytes(z["shard_bytes"].get<int64_t>()).c_str(),
                    static_cast<long long>(z["shard_bytes"].get<int64_t>()),
                    format_bytes(z["persistent_bytes"].get<int64_t>()).c_str(),
                    static_cast<long long>(z["persistent_bytes"].get<int64_t>()),
                    format_bytes(z["peak_gathered_bytes"].get<int64_t>()).c_str(),
                    static_cast<long long>(z["peak_gathered_bytes"].get<int64_t>()),
                    static_cast<long long>(z["prefetched_units"].get<int64_t>()),
                    static_cast<long long>(z["prefetched_unused"].get<int64_t>()));
      out += line;
    }
  }
  const auto& s = r["savings"];
  if (s.contains("estimate")) {
    const auto& e = s["estimate"];
    auto rel = [](int64_t est, int64_t measured) {
      return measured > 0
                 ? 100.0 * static_cast<double>(est - measured) / static_cast<double>(measured)
                 : 0.0;
    };
    const int64_t est = e.value("peak", int64_t{0});
    std::snprintf(
        line, sizeof line,
        "  estimated peak %s during %s (%s) (trainer_bin estimate): %+.1f%% of measured\n",
        format_bytes(est).c_str(), e.value("peak_phase", "").c_str(),
        e.value("peak_detail", "").c_str(), rel(est, r.value("peak_allocated", int64_t{0})));
    out += line;
    const int64_t est_rss = e.value("rss_peak", int64_t{0});
    if (est_rss > 0 && r.value("peak_rss", int64_t{0}) > 0) {
      std::snprintf(line, sizeof line,
                    "  estimated peak RSS %s (%s outside the allocator): %+.1f%% of measured\n",
                    format_bytes(est_rss).c_str(),
                    format_bytes(e.value("outside_allocator", int64_t{0})).c_str(),
                    rel(est_rss, r.value("peak_rss", int64_t{0})));
      out += line;
    }
  }
  if (s.size() > (s.contains("estimate") ? 1u : 0u)) out += "  saved by the enabled techniques:\n";
  if (s.contains("reference_model")) out += format_reference_memory(s["reference_model"]);
  if (s.contains("padding_free")) {
    std::snprintf(
        line, sizeof line, "    padding-free batches: %lld pad tokens never computed\n",
        static_cast<long long>(s["padding_free"].value("pad_tokens_avoided", int64_t{0})));
    out += line;
  }
  if (s.contains("chunked_loss")) {
    const auto& c = s["chunked_loss"];
    std::snprintf(line, sizeof line,
                  "    chunked linear cross-entropy: [%lld x %lld] logits never materialised "
                  "(%s with their gradient)\n",
                  static_cast<long long>(c.value("largest_micro_batch_tokens", int64_t{0})),
                  static_cast<long long>(c.value("vocab_size", int64_t{0})),
                  format_bytes(c.value("logits_bytes_not_materialised", int64_t{0})).c_str());
    out += line;
  }
  if (s.contains("activation_offloading")) {
    const auto& a = s["activation_offloading"];
    std::snprintf(line, sizeof line,
                  "    activation offloading: up to %s of saved activations per micro-batch held "
                  "in pinned host memory instead of the device (%lld tensors moved in all)\n",
                  format_bytes(a.value("bytes_offloaded_per_micro_batch_max", int64_t{0})).c_str(),
                  static_cast<long long>(a.value("tensors_offloaded", int64_t{0})));
    out += line;
  }
  if (s.contains("generation")) {
    const auto& g = s["generation"];
    auto b = [&](const char* key) { return format_bytes(g.value(key, int64_t{0})); };
    std::snprintf(line, sizeof line,
                  "    in-process generation from the trained weights (no second model copy, no "
                  "weight sync): KV-cache pool %s (%lld blocks of %lld tokens, %lld used at "
                  "most)\n",
                  b("kv_cache_pool_bytes").c_str(),
                  static_cast<long long>(g.value("kv_cache_blocks", int64_t{0})),
                  static_cast<long long>(g.value("kv_block_size", int64_t{0})),
                  static_cast<long long>(g.value("kv_blocks_peak_used", int64_t{0})));
    out += line;
    std::snprintf(
        line, sizeof line,
        "    generation phase peak %s allocated, %s reserved; optimizer phase peak %s "
        "allocated, %s reserved\n",
        b("generation_phase_peak_allocated").c_str(), b("generation_phase_peak_reserved").c_str(),
        b("optimizer_phase_peak_allocated").c_str(), b("optimizer_phase_peak_reserved").c_str());
    out += line;
    if (g.value("sleep_mode", false))
      std::snprintf(line, sizeof line,
                    "    sleep mode: %s given back after each generation phase (the pool and "
                    "cached blocks), made again for the next\n",
                    b("sleep_released_bytes").c_str());
    else
      std::snprintf(line, sizeof line,
                    "    sleep mode off: the pool (%s) is held through the optimizer phase "
                    "(--vllm_enable_sleep_mode frees it)\n",
                    b("kv_cache_pool_bytes").c_str());
    out += line;
  }
  if (s.contains("gradient_checkpointing"))
    out +=
        "    gradient checkpointing: only decoder-layer inputs kept between forward and backward\n";
  if (s.contains("sequence_tiling")) {
    const auto& t = s["sequence_tiling"];
    std::snprintf(line, sizeof line,
                  "    sequence tiling: decoder layers in blocks of %lld tokens (--tiled_mlp): no "
                  "[%lld x %lld] MLP intermediate exists whole (%s of gate, up and activation "
                  "per layer never allocated)\n",
                  static_cast<long long>(t.value("chunk_tokens", int64_t{0})),
                  static_cast<long long>(t.value("largest_micro_batch_tokens", int64_t{0})),
                  static_cast<long long>(t.value("intermediate_size", int64_t{0})),
                  format_bytes(t.value("mlp_bytes_not_materialised", int64_t{0})).c_str());
    out += line;
  }
  if (s.contains("streaming_load")) {
    const auto& l = s["streaming_load"];
    std::snprintf(line, sizeof line,
                  "    streaming weight loading: safetensors read tensor by tensor, each file's "
                  "pages released once copied or quantized (host holds one tensor of at most %s, "
                  "not the %s of weights)\n",
                  format_bytes(l.value("largest_tensor_bytes", int64_t{0})).c_str(),
                  format_bytes(l.value("weight_bytes", int64_t{0})).c_str());
    out += line;
  }
  if (s.contains("quantized_base")) {
    const auto& q = s["quantized_base"];
    std::snprintf(line, sizeof line,
                  "    quantized base (%s): %lld frozen linear weights in %s instead of %s\n",
                  q.value("kind", "").c_str(),
                  static_cast<long long>(q.value("modules", int64_t{0})),
                  format_bytes(q.value("quantized_bytes", int64_t{0})).c_str(),
                  format_bytes(q.value("dense_bytes", int64_t{0})).c_str());
    out += line;
  }
  if (s.contains("peft")) {
    const auto& p = s["peft"];
    std::snprintf(line, sizeof line,
                  "    LoRA: %lld of %lld parameters trained; %s of gradients and optimizer state "
                  "never allocated\n",
                  static_cast<long long>(p.value("trainable_parameters", int64_t{0})),
                  static_cast<long long>(p.value("total_parameters", int64_t{0})),
                  format_bytes(p.value("grad_and_optimizer_bytes_avoided", int64_t{0})).c_str());
    out += line;
  }
  return out;
}

const std::vector<std::string>& sft_model_option_names() {
  static const std::vector<std::string> names = {"model_name_or_path",
                                                 "device",
                                                 "bf16",
                                                 "chat_template",
                                                 "chat_template_kwargs",
                                                 "use_peft",
                                                 "lora_r",
                                                 "lora_alpha",
                                                 "lora_dropout",
                                                 "lora_target_modules",
                                                 "use_rslora",
                                                 "lora_modules_to_save",
                                                 "trainable_token_indices",
                                                 "load_in_4bit",
                                                 "load_in_8bit",
                                                 "bnb_4bit_quant_type",
                                                 "bnb_4bit_use_double_quant",
                                                 "bnb_4bit_compute_dtype",
                                                 "llm_int8_skip_modules"};
  return names;
}

SftModel load_sft_model(const Options& o) {
  SftModel m;
  SftSetup& setup = m.setup;
  setup.model_name_or_path = o.get_string("model_name_or_path");
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
  const Device device = Device::parse(o.get_string("device"));
  const DType dtype = o.get_bool("bf16") ? DType::kBF16 : DType::kF32;
  const auto seed = static_cast<uint64_t>(o.get_int("seed"));
  m.tokenizer = Tokenizer::load(setup.tokenizer_dir);
  apply_chat_options(o, *m.tokenizer);

  // QLoRA: the base is quantized while loading (before adapters and the optimizer exist, so
  // nothing keeps the dense weights alive).
  const QuantConfig quant = quant_config_from_options(o, dtype);
  const bool adapter_dir = !setup.embedded && is_adapter_dir(setup.model_name_or_path);
  LT_CHECK_INPUT(!quant.enabled() || o.get_bool("use_peft") || adapter_dir,
                 "options load_in_4bit / load_in_8bit need use_peft: a quantized base is frozen, "
                 "only adapters train");
  m.base_name = setup.model_name_or_path;
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
  LT_CHECK_INPUT(m.tokenizer->vocab_size() <= m.model->config().vocab_size, "the tokenizer has ",
                 m.tokenizer->vocab_size(), " tokens but the model's vocab_size is ",
                 m.model->config().vocab_size);
  return m;
}

SftRun make_sft_run(const Options& o, const SftModel& m, const SftRunInputs& in) {
  TrainingArguments args = training_arguments(o);
  prepare_run(args);
  SftRun run;
  run.setup = m.setup;
  SftSetup& setup = run.setup;
  setup.dataset = o.get_string("dataset");
  if (in.dataset_rows) {
    LT_CHECK_INPUT(setup.dataset.empty(), "option dataset ", setup.dataset,
                   ": the training rows are also given in memory; give one of them");
    setup.dataset = "dataset_rows";
  } else if (setup.dataset.empty()) {
    LT_CHECK_INPUT(setup.embedded, "sft: --dataset is required when --model_name_or_path is given");
    setup.dataset = setup.tokenizer_dir + "/stories.jsonl";
  }
  run.tokenizer = m.tokenizer;
  run.model = m.model;
  const std::string base_name =
      adapter_base_name(m, o.get_bool("use_peft"), args.output_dir, args.seed);
  std::unique_ptr<TextEncoder> encoder = make_text_encoder(run.tokenizer);
  run.eos_token_id = encoder->eos_token_id();

  DataConfig dc;
  read_dataset_options(o, &dc);
  dc.max_length = o.get_int_or_none("max_length").value_or(0);
  dc.truncation_mode = o.get_string("truncation_mode");
  dc.packing = o.get_bool("packing");
  dc.packing_strategy = o.get_string("packing_strategy");
  dc.packing_window = o.get_int("packing_window");
  dc.padding_free = o.get_bool_or_none("padding_free");
  dc.pad_to_multiple_of = context_parallel_pad_multiple(
      args.cp_size, o.get_int_or_none("pad_to_multiple_of").value_or(0));
  dc.per_device_train_batch_size = args.per_device_train_batch_size;
  dc.seed = args.seed;
  validate_data_config(dc);

  SftData train = load_sft_data(JsonlSource(setup.dataset, in.dataset_rows), encoder.get(), dc);
  auto train_examples = std::make_shared<TokenizedDataset>(std::move(train.examples));
  // Data parallel: every rank takes its own shard of the micro-batches (data_loader.h); the
  // ranks of a context-parallel group share theirs.
  // The ring attention (kernels/ring_attention.h) runs on CPU ranks over MPI in f32, and on CUDA
  // ranks over NCCL in f32, bf16 or f16 (the CUDA path has not run on a GPU yet).
  auto cp_groups = context_parallel_for(*run.model, args.cp_size, args.comm, in.comm.get());
  auto loader = std::make_shared<DataLoader>(train_examples, dc, encoder->pad_token_id(),
                                             cp_groups->dp_rank, cp_groups->dp_size);
  std::shared_ptr<DataLoader> eval;
  if (!o.get_string("eval_dataset").empty()) {
    DataConfig ec = dc;
    ec.shuffle = false;
    ec.per_device_train_batch_size = args.per_device_eval_batch_size;
    SftData ev = load_sft_data(o.get_string("eval_dataset"), encoder.get(), ec);
    eval = std::make_shared<DataLoader>(std::make_shared<TokenizedDataset>(std::move(ev.examples)),
                                        ec, encoder->pad_token_id());
  }
  run.trainer =
      std::make_unique<SftTrainer>(args, run.model, o, run.tokenizer, setup.tokenizer_dir, loader,
                                   eval, train.stats, o.get_bool("use_liger_kernel"));
  run.trainer->set_communicator(in.comm);
  run.trainer->set_peft(m.peft, base_name, o.get_bool("merge_adapter"));
  run.trainer->set_context_parallel(cp_groups, encoder->pad_token_id());
  if (m.quant.enabled()) run.trainer->set_quantized_base(m.quant, m.quant_report);
  return run;
}

SftRun make_sft_run(const Options& o) {
  LT_CHECK_INPUT(!o.get_string("model_name_or_path").empty() || o.get_string("dataset").empty(),
                 "sft: --model_name_or_path is required when --dataset is given");
  return make_sft_run(o, load_sft_model(o));
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
       {"warmup_ratio", 0.05},
       {"max_steps", 120},
       {"logging_steps", 10},
       {"save_steps", 0},
       {"weight_decay", 0.01},
       {"output_dir", "trainer_output/embedded"}},
      [](const Options& o) {
        check_model_for_dataset("sft", o);
        SftRun r = make_sft_run(o);
        return TrainRun{r.model, std::move(r.trainer), ""};
      },
      [](const Options& o, SftModel m) {
        SftRun r = make_sft_run(o, m);
        return TrainRun{r.model, std::move(r.trainer), ""};
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
