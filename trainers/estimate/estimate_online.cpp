// Online runs' memory estimate: see the header.
#include "trainers/estimate/estimate_online.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "engine/allocator.h"
#include "engine/checked_int.h"
#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "models/generate.h"
#include "models/kv_cache.h"
#include "trainers/common/data_options.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/estimate/estimate_pref.h"
#include "trainers/online/grpo.h"

namespace leantune {

nlohmann::json OnlineEstimate::to_json() const {
  nlohmann::json j = policy.to_json();
  j["reference_mode"] = reference_mode;
  j["reference_params"] = reference_params;
  j["generation"] = {{"prompts", prompts_per_generation}, {"num_generations", num_generations},
                     {"prompt_length", prompt_length},    {"max_new_tokens", max_new_tokens},
                     {"kv_cache_blocks", kv_blocks},      {"kv_block_size", kv_block_size},
                     {"kv_cache_pool", kv_pool},          {"workspace", generation_workspace},
                     {"sleep_mode", sleep_mode}};
  if (teacher_generation > 0) j["generation"]["teacher_generation"] = teacher_generation;
  j["generation_phase_peak"] = generation_peak;
  j["optimizer_phase_peak"] = optimizer_peak;
  j["peak"] = peak;
  j["peak_phase"] = peak_phase;
  return j;
}

int64_t generation_workspace_bytes(const ModelConfig& m, DType dtype, const OnlineShape& s) {
  using I = CheckedInt;
  const I b = static_cast<int64_t>(dtype_size(dtype));
  const I h = m.hidden_size, qd = I(m.num_attention_heads) * m.head_dim,
          kvd = I(m.num_key_value_heads) * m.head_dim, inter = m.intermediate_size;
  // One layer over `rows` new rows attending over `keys` gathered keys, and the logits of
  // `last` rows: the larger of the attention point (input, normed input, q, k, v, the gathered
  // keys and values, the output and its f32 log-sum-exp) and the MLP point (input, the attention
  // block's output, its norm, gate, up and their product).
  auto step = [&](I rows, I keys, I last) {
    const I attention = b * (rows * h * 2 + rows * qd * 2 + rows * kvd * 2 + keys * kvd * 2) +
                        rows * m.num_attention_heads * 4;
    const I mlp = b * (rows * h * 3 + rows * inter * 3);
    return std::max(attention, mlp) + b * last * (h + m.vocab_size);
  };
  const I u = s.prompts_per_generation, n = u * s.num_generations;
  const I prefill = step(u * s.prompt_length, u * s.prompt_length, u);
  const I decode =
      s.max_new_tokens >= 2 ? step(n, n * (I(s.prompt_length) + s.max_new_tokens - 1), n) : I(0);
  return std::max(prefill, decode).get();
}

int64_t kv_pool_bytes(const ModelConfig& m, DType dtype, int64_t blocks, int64_t block_size) {
  using I = CheckedInt;
  return (I(2) * m.num_hidden_layers * blocks * block_size * m.num_key_value_heads * m.head_dim *
          static_cast<int64_t>(dtype_size(dtype)))
      .get();
}

OnlineEstimate estimate_online(const EstimateConfig& policy, const OnlineShape& s,
                               const std::string& reference_mode, int64_t reference_params) {
  using I = CheckedInt;
  OnlineEstimate e;
  e.config = policy;
  e.shape = s;
  e.policy = estimate_memory(policy);
  e.reference_mode = reference_mode;
  e.reference_params = reference_params;
  e.prompts_per_generation = s.prompts_per_generation;
  e.num_generations = s.num_generations;
  e.prompt_length = s.prompt_length;
  e.max_new_tokens = s.max_new_tokens;
  e.kv_block_size = s.kv_block_size;
  e.kv_blocks =
      s.kv_cache_blocks > 0
          ? s.kv_cache_blocks
          : (I(s.prompts_per_generation) * kv_blocks_for_prompt(s.prompt_length, s.num_generations,
                                                                s.max_new_tokens, s.kv_block_size))
                .get();
  e.kv_pool = kv_pool_bytes(policy.model, policy.dtype, e.kv_blocks, s.kv_block_size);
  e.generation_workspace = generation_workspace_bytes(policy.model, policy.dtype, s);
  e.sleep_mode = s.sleep_mode;
  e.generation_peak = (I(e.policy.params) + reference_params + e.policy.optimizer + e.kv_pool +
                       e.generation_workspace)
                          .get();
  e.optimizer_peak = (I(e.policy.peak) + reference_params + (s.sleep_mode ? 0 : e.kv_pool)).get();
  e.peak = std::max(e.generation_peak, e.optimizer_peak);
  e.peak_phase = e.generation_peak > e.optimizer_peak ? "generation" : e.policy.peak_phase;
  return e;
}

namespace {

// The longest prompt the trainer would generate from, tokenized as it tokenizes.
int64_t longest_prompt(const std::string& dataset, const std::string& chat_template,
                       const std::string& model_dir) {
  std::shared_ptr<Tokenizer> tok;
  try {
    tok = Tokenizer::load(model_dir);
  } catch (const Error& err) {
    LT_THROW(ErrorKind::kInput, "option --prompt_length: not given, and no tokenizer in ",
             model_dir, " to measure the prompts with (", err.what(), ")");
  }
  const auto enc = make_text_encoder(tok, chat_template);
  const OnlinePrompts p =
      dataset.empty() ? builtin_online_prompts(*enc) : load_online_prompts(dataset, *enc, false);
  int64_t longest = 1;
  for (const PromptRow& r : p.rows) longest = std::max<int64_t>(longest, r.ids.size());
  return longest;
}

}  // namespace

OnlineEstimate estimate_online_from_options(const Options& o, const std::string& algorithm,
                                            const std::string& path, bool cpu) {
  const bool dpo = algorithm == "online_dpo";
  namespace fs = std::filesystem;
  const std::string dir = fs::is_directory(path) ? path : fs::path(path).parent_path().string();
  const ModelConfig model = ModelConfig::load(path);
  const TrainingArguments args = training_arguments(o);
  LT_CHECK_INPUT(args.cp_size == 1, "option cp_size ", args.cp_size,
                 ": the online trainers do not split sequences over ranks");
  const OnlineArguments oa = online_table(algorithm).read(o);
  const OnlineEstimateArguments ea = online_estimate_table().read(o);
  OnlineShape s;
  s.num_generations = dpo ? 2 : oa.num_generations;
  const int64_t steps_per_generation =
      dpo ? 1 : oa.steps_per_generation.value_or(args.gradient_accumulation_steps);
  const int64_t completions =
      (CheckedInt(args.per_device_train_batch_size) * (dpo ? 2 : steps_per_generation)).get();
  LT_CHECK_INPUT(completions % s.num_generations == 0, algorithm, ": the generation batch (",
                 completions, " completions) must be a multiple of num_generations ",
                 s.num_generations);
  s.prompts_per_generation = completions / s.num_generations;
  s.max_new_tokens = dpo ? oa.max_new_tokens : oa.max_completion_length;
  s.prompt_length = ea.prompt_length > 0
                        ? ea.prompt_length
                        : longest_prompt(oa.dataset, chat_table().read(o).chat_template, dir);
  s.kv_cache_blocks = oa.kv_cache_blocks;
  s.kv_block_size = oa.kv_block_size;
  s.sleep_mode = oa.vllm_enable_sleep_mode;
  // One micro-batch of prompt + completion sequences (online_dpo: both of each prompt's two,
  // cut to max_length).
  int64_t length = (CheckedInt(s.prompt_length) + s.max_new_tokens).get();
  if (dpo) length = std::min(length, oa.max_length);
  const int64_t per_micro =
      dpo ? 2 * args.per_device_train_batch_size : args.per_device_train_batch_size;
  const PeftArguments peft = peft_table().read(o);
  const QuantConfig quant = quant_config_from_options(o, args.bf16 ? DType::kBF16 : DType::kF32);
  EstimateConfig c =
      estimate_config(model, args, peft.use_peft ? &peft.config : nullptr, quant, oa.use_liger_loss,
                      length, cpu, (CheckedInt(per_micro) * length).get(), length);
  c.world_size = ea.ranks.world_size;
  if (algorithm == "distill") {
    // The teacher is held like a separate reference model: its weights (dense, NF4 or int8; with
    // teacher_offload the outer unit and two layers), its no-grad forward at scoring time (the
    // divergence's tiles are chunked).
    const fs::path tcfg = fs::path(oa.teacher_model_name_or_path) / "config.json";
    const ModelConfig teacher = !oa.teacher_model_name_or_path.empty() && fs::exists(tcfg)
                                    ? ModelConfig::load(tcfg.string())
                                    : model;
    const DType tdt =
        distill_teacher_dtype(oa.teacher_model_init_kwargs, args.bf16 ? DType::kBF16 : DType::kF32,
                              fs::exists(tcfg) ? oa.teacher_model_name_or_path : std::string());
    const bool teacher16 = dtype_size(tdt) == 2;
    int64_t teacher_bytes = reference_param_bytes("ref_model", model, teacher, teacher16,
                                                  oa.teacher_load_in_4bit, oa.teacher_load_in_8bit);
    if (oa.teacher_offload && teacher.num_hidden_layers > 0) {
      // On the device: the embedding, the final norm and the head, and at most two layers.
      const int64_t elem = static_cast<int64_t>(dtype_size(tdt));
      const int64_t outer = ((CheckedInt(teacher.vocab_size) * teacher.hidden_size *
                              (teacher.tie_word_embeddings ? 1 : 2)) +
                             teacher.hidden_size)
                                .get() *
                            elem;
      const int64_t layer = (teacher_bytes - outer) / teacher.num_hidden_layers;
      teacher_bytes = outer + std::min<int64_t>(2, teacher.num_hidden_layers) * layer;
    }
    OnlineEstimate e = estimate_online(c, s, "teacher", teacher_bytes);
    if (oa.seq_kd && oa.lmbda < 1.0) {
      using I = CheckedInt;
      const int64_t blocks =
          (I(s.prompts_per_generation) *
           kv_blocks_for_prompt(s.prompt_length, 1, s.max_new_tokens, kCallKvBlockSize))
              .get();
      e.teacher_generation = (I(kv_pool_bytes(teacher, tdt, blocks, kCallKvBlockSize)) +
                              generation_workspace_bytes(teacher, tdt, s))
                                 .get();
      // At lmbda 0 the student never generates: no pool of its own.
      const bool student_generates = oa.lmbda > 0.0;
      if (!student_generates) {
        e.kv_blocks = e.kv_pool = e.generation_workspace = 0;
        e.optimizer_peak = (I(e.policy.peak) + teacher_bytes).get();
      }
      const int64_t held = student_generates && !s.sleep_mode ? e.kv_pool : 0;
      const int64_t by_teacher =
          (I(e.policy.params) + teacher_bytes + e.policy.optimizer + held + e.teacher_generation)
              .get();
      e.generation_peak = student_generates ? std::max(e.generation_peak, by_teacher) : by_teacher;
      e.peak = std::max(e.generation_peak, e.optimizer_peak);
      e.peak_phase = e.generation_peak > e.optimizer_peak ? "generation" : e.policy.peak_phase;
    }
    return e;
  }
  const RefModelConfig rc = ref_model_table().read(o);
  std::string mode = "none";
  if (dpo || oa.beta != 0.0)
    mode = !rc.ref_model.empty() ? "ref_model" : peft.use_peft ? "adapters_off" : "policy_copy";
  int64_t ref_bytes = 0;
  if (mode != "none") {
    const fs::path rcfg = fs::path(rc.ref_model) / "config.json";
    const ModelConfig ref =
        !rc.ref_model.empty() && fs::exists(rcfg) ? ModelConfig::load(rcfg.string()) : model;
    ref_bytes = reference_param_bytes(mode, model, ref, args.bf16, rc.ref_load_in_4bit);
  }
  return estimate_online(c, s, mode, ref_bytes);
}

const OptionTable<OnlineEstimateArguments>& online_estimate_table() {
  using A = OnlineEstimateArguments;
  static const OptionTable<A> t =
      OptionTable<A>()
          .integer("prompt_length", &A::prompt_length,
                   "prompt tokens to plan for (0: the longest prompt of --dataset, or of the "
                   "built-in task, as the trainer tokenizes it)",
                   0)
          .nested(&A::ranks, world_size_table());
  return t;
}

void add_online_estimate_options(Options& o) { online_estimate_table().declare(o); }

int run_estimate_online(const std::vector<std::string>& argv, const std::string& algorithm) {
  Options o = online_options(algorithm);
  add_online_estimate_options(o);
  if (!o.parse(argv)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  apply_demo_defaults(*find_trainer_spec(algorithm), o);
  std::string path = online_table(algorithm).read(o).model_name_or_path;
  if (path.empty()) path = embedded_data_dir() + "/config.json";
  const bool cpu = Device::parse(training_table().read(o).device).is_cpu();
  const OnlineEstimate e = estimate_online_from_options(o, algorithm, path, cpu);
  const EstimateConfig& c = e.config;
  const OnlineShape& s = e.shape;
  std::printf(
      "%s estimate for %s (%lld parameters) on %s, %s: %lld prompts x %lld generations per "
      "generation batch, prompts up to %lld tokens, up to %lld new tokens; %lld tokens per "
      "micro-batch\n",
      algorithm.c_str(), path.c_str(), static_cast<long long>(e.policy.total_parameters),
      cpu ? "cpu" : "cuda", dtype_name(c.dtype), static_cast<long long>(s.prompts_per_generation),
      static_cast<long long>(s.num_generations), static_cast<long long>(s.prompt_length),
      static_cast<long long>(s.max_new_tokens), static_cast<long long>(c.micro_batch_tokens));
  auto row = [](const char* what, int64_t v, const std::string& note = "") {
    std::printf("  %-28s %12s%s%s\n", what, format_bytes(v).c_str(), note.empty() ? "" : "  ",
                note.c_str());
  };
  row("policy params", e.policy.params);
  row(e.reference_mode == "teacher" ? "teacher weights" : "reference weights", e.reference_params,
      "(" + e.reference_mode + ")");
  row("optimizer states", e.policy.optimizer);
  row("kv-cache pool", e.kv_pool,
      "(" + std::to_string(e.kv_blocks) + " blocks of " + std::to_string(e.kv_block_size) +
          " tokens)");
  std::printf("generation phase:\n");
  row("generation step transients", e.generation_workspace);
  if (e.teacher_generation > 0)
    row("teacher's generation", e.teacher_generation, "(seq_kd: its own pool and transients)");
  row("generation phase peak", e.generation_peak);
  std::printf("optimizer phase:\n");
  row("grads", e.policy.grads);
  row("activations", e.policy.activations);
  row("loss (held)", e.policy.loss);
  row("workspace at peak", e.policy.workspace);
  row("kv-cache pool held", s.sleep_mode ? 0 : e.kv_pool,
      s.sleep_mode ? "(asleep: vllm_enable_sleep_mode)" : "(--vllm_enable_sleep_mode frees it)");
  row("optimizer phase peak", e.optimizer_peak, "(during " + e.policy.peak_phase + ")");
  row("peak", e.peak, "(" + e.peak_phase + ")");
  if (!s.sleep_mode) {
    OnlineShape asleep = s;
    asleep.sleep_mode = true;
    std::printf("with --vllm_enable_sleep_mode: peak %s\n",
                format_bytes(estimate_online(c, asleep, e.reference_mode, e.reference_params).peak)
                    .c_str());
  }
  return 0;
}

}  // namespace leantune
