// The online trainers' options, prompt data and built-in task (see grpo.h).
#include <cmath>
#include <cstdio>
#include <fstream>

#include "engine/check.h"
#include "loaders/dataset.h"
#include "loaders/jsonl.h"
#include "trainers/common/data_options.h"
#include "trainers/common/optim_options.h"
#include "trainers/common/option_groups.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/estimate/estimate_online.h"
#include "trainers/online/grpo.h"

namespace leantune {

namespace {

// One row -> its prompt tokens; `where` names the file and line in errors.
PromptRow prompt_row(nlohmann::json row, int64_t line, const TextEncoder& enc, bool need_solution,
                     const std::string& where, bool* conversational) {
  LT_CHECK_INPUT(row.is_object(), where, ": a row must be a JSON object");
  LT_CHECK_INPUT(row.contains("prompt"), where,
                 ": no \"prompt\" column (the online trainers complete prompts)");
  const nlohmann::json& p = row["prompt"];
  PromptRow r;
  r.line = line;
  if (p.is_string()) {
    r.ids = enc.encode(p.get<std::string>(), true);
    *conversational = false;
  } else {
    r.ids = enc.encode_chat(prompt_messages(p, where), true).ids;
    *conversational = true;
  }
  LT_CHECK_INPUT(!r.ids.empty(), where, ": the prompt tokenizes to nothing");
  LT_CHECK_INPUT(!need_solution || !row_solution(row).empty(), where,
                 ": accuracy_reward needs a \"solution\" or \"answer\" column");
  r.row = std::move(row);
  return r;
}

}  // namespace

OnlineArguments online_arguments_defaults(const std::string& algorithm) {
  OnlineArguments a;
  if (algorithm == "rloo") {
    a.num_generations = 2;
    a.beta = 0.05;
  } else if (algorithm == "online_dpo") {
    a.temperature = 0.9;
    a.beta = 0.1;
    a.loss_type = "sigmoid";
  } else if (algorithm == "distill") {
    a.num_generations = 1;
    a.beta = 1.0;  // DistillationConfig: reverse KL
  }
  return a;
}

namespace {

OptionTable<OnlineArguments> make_online_table(const std::string& algorithm) {
  using A = OnlineArguments;
  const bool grpo = algorithm == "grpo", dpo = algorithm == "online_dpo",
             distill = algorithm == "distill";
  static const OptionTable<ModelSource> source = model_source_table(
      "HF model folder to train (empty with no dataset: the built-in demo model and task)",
      "prompts: JSONL rows with \"prompt\" (a string or a message list); the other columns "
      "reach the reward sources");
  OptionTable<A> t(online_arguments_defaults(algorithm));
  t.base(source);
  if (distill) {
    // DistillationConfig: one completion per prompt, the generation batch the whole update.
    t.text("teacher_model_name_or_path", &A::teacher_model_name_or_path,
           "the frozen teacher: an HF model folder (or cached Hub ID) with the student's "
           "vocabulary (empty with no model and dataset: the demo model teaches a fresh student)")
        .text("teacher_model_revision", &A::teacher_model_revision,
              "the teacher's revision (branch, tag or commit) when --teacher_model_name_or_path "
              "is a Hub ID in the local cache")
        .text("teacher_model_init_kwargs", &A::teacher_model_init_kwargs,
              "the teacher's from_pretrained kwargs as a JSON object; \"torch_dtype\" (or "
              "\"dtype\": bfloat16, float16, float32, auto) loads it in another dtype than the "
              "student's; other keys are refused")
        .flag("teacher_load_in_4bit", &A::teacher_load_in_4bit,
              "load the teacher's linear weights in NF4 (frozen, bitsandbytes' format, as "
              "--ref_load_in_4bit): about a quarter of its dense bytes")
        .flag("teacher_load_in_8bit", &A::teacher_load_in_8bit,
              "load the teacher's linear weights in int8 (frozen, one scale per output row, as "
              "--load_in_8bit): about half of its bf16 bytes")
        .flag("teacher_offload", &A::teacher_offload,
              "keep the teacher's decoder layers in pinned host memory and bring them to the "
              "device one at a time, the next one prefetched on a copy stream (at most two "
              "layers on the device; with --teacher_load_in_4bit/8bit, their quantized form)")
        .integer("max_completion_length", &A::max_completion_length,
                 "most tokens generated per completion", 1)
        .real("temperature", &A::temperature,
              "sampling temperature, and both distributions' in the divergence", 1e-6);
  } else if (dpo) {
    // OnlineDPOConfig: two completions per prompt, one micro-batch per generation.
    t.integer("max_new_tokens", &A::max_new_tokens, "most tokens generated per completion", 1)
        .real("temperature", &A::temperature, "sampling temperature", 1e-6)
        .text("judge", &A::judge,
              "a pairwise judge instead of the reward sources: a reward model folder (both "
              "completions scored; the higher chosen) or a command (sh -c) reading one JSON line "
              "{prompt, completions: [A, B], columns} per pair and answering 0 (A better), 1 (B), "
              "-1 or null (no verdict: B is chosen, as TRL); pairs shown in a seeded random order");
  } else {
    t.integer("num_generations", &A::num_generations, "completions per prompt", 2)
        .integer("max_completion_length", &A::max_completion_length,
                 "most tokens generated per completion", 1)
        .integer_or_none("steps_per_generation", &A::steps_per_generation,
                         "micro-batches per generation batch (none: gradient_accumulation_steps)",
                         1)
        .real("temperature", &A::temperature, "sampling temperature (the loss scores under it too)",
              1e-6);
  }
  t.real("top_p", &A::top_p, "nucleus sampling mass", 1e-9, 1.0)
      .integer("top_k", &A::top_k, "sample among the k most likely tokens (0 = off)", 0)
      .real("min_p", &A::min_p, "drop tokens below min_p times the most likely one's probability",
            0.0, 1.0)
      .real("repetition_penalty", &A::repetition_penalty,
            "transformers' repetition penalty (1 = off)", 1e-6);
  if (distill) {
    t.real("beta", &A::beta,
           "the divergence: 0 forward KL(teacher || student), 1 reverse KL(student || teacher), "
           "between: the generalized Jensen-Shannon divergence with this mixture weight",
           0.0, 1.0)
        .real("lmbda", &A::lmbda,
              "GKD's share of on-policy generation batches: each batch is the student's "
              "completions with this probability, else the dataset's \"completion\" column "
              "(prompt_completion rows; 1: always generate, as DistillationTrainer)",
              0.0, 1.0)
        .flag("seq_kd", &A::seq_kd,
              "GKD's sequence-level KD: the off-policy batches (--lmbda below 1) are the "
              "teacher's completions, sampled with the same options, instead of the dataset's");
  } else if (dpo) {
    t.real("beta", &A::beta, "DPO's beta (IPO's tau)", 0.0)
        .text("loss_type", &A::loss_type, "DPO loss on the judged pairs", {"sigmoid", "ipo"})
        .integer("max_length", &A::max_length,
                 "prompt + completion tokens scored: longer prompts lose their first tokens (the "
                 "completion is kept; at least one prompt token stays)",
                 2)
        .real("missing_eos_penalty", &A::missing_eos_penalty,
              "subtracted from the reward of a completion with no eos token (0 = none)", 0.0);
  } else {
    t.real("beta", &A::beta,
           grpo ? "KL coefficient (0: no reference model)"
                : "KL coefficient of the reward penalty (0: no reference model)",
           0.0)
        .integer("num_iterations", &A::num_iterations,
                 "updates per generation batch (old log-probs kept)", 1)
        .real("epsilon", &A::epsilon, "lower clipping bound of the ratio", 0.0)
        .real("epsilon_high", &A::epsilon_high, "upper clipping bound (negative: epsilon)");
    if (grpo) {
      t.text("loss_type", &A::loss_type, "loss aggregation", {"grpo", "bnpo", "dr_grpo", "dapo"})
          .text("scale_rewards", &A::scale_rewards,
                "divide advantages by the std of the rewards: per group (group), over the whole "
                "generation batch (batch), or not at all (none)",
                {"group", "batch", "none"})
          .flag("use_bias_correction_kl", &A::use_bias_correction_kl,
                "multiply the KL term by the importance ratio (its value is 1 on-policy, its "
                "gradient is not): the unbiased reverse-KL gradient of DeepSeek-V3.2, TRL's "
                "default; false: the plain k3 estimator's gradient");
    } else {
      t.flag("normalize_advantages", &A::normalize_advantages,
             "normalise the advantages over the batch");
    }
    t.flag("mask_truncated_completions", &A::mask_truncated_completions,
           "completions that hit max_completion_length take no part in the loss");
  }
  t.flag("vllm_enable_sleep_mode", &A::vllm_enable_sleep_mode,
         "after each generation phase give the KV-cache pool and the allocator's cached blocks "
         "back, so the optimizer phase does not hold them; they return at the next generation")
      .alias("generation_sleep", "vllm_enable_sleep_mode")
      .integer("kv_cache_blocks", &A::kv_cache_blocks,
               "KV-cache pool, in blocks (0: enough for a whole generation batch at the longest "
               "prompt; fewer: continuous batching runs what fits)",
               0)
      .integer("kv_block_size", &A::kv_block_size, "tokens per KV-cache block", 1, 4096)
      .flag("ds3_gather_for_generation", &A::ds3_gather_for_generation,
            "zero_stage 3: gather the whole model once for each generation phase (false: layer "
            "by layer at every step, slower, for models larger than one device; the same tokens)");
  // distill's divergence is always chunked and it has no rewards.
  if (!distill)
    t.flag("use_liger_loss", &A::use_liger_loss,
           "chunked LM head for the log-probabilities: the [tokens x vocab] logits never exist "
           "(leantune's option, not in TRL 1.16)")
        .nested(&A::rewards, reward_source_table());
  return t;
}

}  // namespace

const OptionTable<OnlineArguments>& online_table(const std::string& algorithm) {
  static const OptionTable<OnlineArguments> grpo = make_online_table("grpo"),
                                            rloo = make_online_table("rloo"),
                                            dpo = make_online_table("online_dpo"),
                                            distill = make_online_table("distill");
  if (algorithm == "grpo") return grpo;
  if (algorithm == "rloo") return rloo;
  if (algorithm == "distill") return distill;
  LT_CHECK(algorithm == "online_dpo", "online trainers: unknown algorithm '", algorithm, "'");
  return dpo;
}

Options online_options(const std::string& algorithm) {
  Options o = online_table(algorithm).options(algorithm);
  if (algorithm != "distill") add_ref_model_options(o);  // distill has a teacher instead
  add_chat_options(o);
  add_model_run_groups(o);
  // GRPOConfig's and RLOOConfig's default; OnlineDPOConfig's.
  o.set_default("learning_rate", algorithm == "online_dpo" ? 5e-7 : 1e-6);
  return o;
}

std::string OnlinePrompts::summary() const {
  return path + ": " + std::to_string(rows.size()) + " prompts" +
         (conversational ? " (conversational)" : "") +
         (completions_summary.empty() ? "" : "; " + completions_summary);
}

OnlinePrompts load_online_prompts(const JsonlSource& source, const TextEncoder& enc,
                                  bool need_solution) {
  JsonlReader in(source);
  OnlinePrompts d;
  d.path = source.path;
  const std::string& path = d.path;
  std::string_view text;
  bool first = true;
  DatasetFormat format;  // of the first row: a file has one schema (dataset.h)
  int64_t format_line = 0;
  while (in.next_line(&text)) {
    const int64_t line = in.line_number();
    const std::string where = path + ":" + std::to_string(line);
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      LT_THROW(ErrorKind::kInput, where, ": not JSON (", e.what(), ")");
    }
    bool conv = false;
    d.rows.push_back(prompt_row(std::move(row), line, enc, need_solution, where, &conv));
    const nlohmann::json& r = d.rows.back().row;
    if (first) {
      format = detect_format(r, "text");
      format_line = line;
    } else if (auto p = check_row_format(format, format_line, r, "text")) {
      LT_THROW(ErrorKind::kInput, where, ": ", p->message,
               p->kind == BadLineKind::kMissingKey ? format_note(format, format_line) : "");
    }
    LT_CHECK_INPUT(first || conv == d.conversational, where,
                   ": rows mix string prompts and message-list prompts");
    d.conversational = conv;
    first = false;
  }
  LT_CHECK_INPUT(!d.rows.empty(), path, ": no prompt rows");
  return d;
}

std::vector<nlohmann::json> builtin_task_rows() {
  std::vector<nlohmann::json> rows;
  for (int a = 0; a <= 9; ++a)
    for (int b = 0; b <= 9; ++b)
      rows.push_back({{"prompt", "Add " + std::to_string(a) + " and " + std::to_string(b) + "."},
                      {"answer", std::to_string(a + b)}});
  return rows;
}

OnlinePrompts builtin_online_prompts(const TextEncoder& enc) {
  OnlinePrompts d;
  d.path = "built-in task";
  int64_t i = 0;
  bool conv = false;
  for (nlohmann::json& row : builtin_task_rows()) {
    ++i;
    d.rows.push_back(prompt_row(std::move(row), i, enc, true, d.path, &conv));
  }
  return d;
}

namespace {

// The built-in arithmetic task's settings. online_dpo: prompts, 64 completions; ties (most pairs
// early on) still pull one way or the other, so it takes a larger step for longer than grpo's.
std::vector<std::pair<std::string, nlohmann::json>> online_demo_defaults(
    const std::string& algorithm) {
  const bool dpo = algorithm == "online_dpo";
  std::vector<std::pair<std::string, nlohmann::json>> d;
  if (algorithm == "distill")
    // The demo model teaches a fresh initialisation of itself on the task's prompts.
    return {{"max_completion_length", 8},
            {"per_device_train_batch_size", 16},
            {"learning_rate", 3e-3},
            {"max_steps", 30},
            {"lr_scheduler_type", "constant"},
            {"logging_steps", 5},
            {"save_steps", 0},
            {"output_dir", "trainer_output/embedded_distill"}};
  if (dpo)
    d = {{"max_new_tokens", 4}, {"temperature", 1.0}};
  else
    d = {{"num_generations", 8}, {"max_completion_length", 4}};
  const std::vector<std::pair<std::string, nlohmann::json>> shared = {
      {"per_device_train_batch_size", 32},
      {"learning_rate", dpo ? 1e-2 : 3e-3},
      {"max_steps", dpo ? 60 : 40},
      {"lr_scheduler_type", "constant"},
      {"logging_steps", 5},
      {"save_steps", 0},
      {"reward_funcs", nlohmann::json::array({"format_reward", "accuracy_reward"})},
      {"format_pattern", "^ *[0-9]"},
      {"output_dir", "trainer_output/embedded_" + algorithm}};
  d.insert(d.end(), shared.begin(), shared.end());
  return d;
}

TrainerSpec online_spec(const std::string& algorithm, const std::string& summary) {
  return TrainerSpec{
      algorithm,
      summary,
      "prompts",
      online_options,
      online_demo_defaults(algorithm),
      [algorithm](const Options& o) { return train_run(make_online_run(algorithm, o)); },
      [algorithm](const Options& o, SftModel m, const RunInputs& in) {
        return train_run(make_online_run(algorithm, o, std::move(m), in));
      },
      algorithm == "online_dpo"
          ? std::vector<std::pair<std::string, int>>{{"rewards/accuracies", 3}}
      : algorithm == "distill" ? std::vector<std::pair<std::string, int>>{{"entropy", 3}}
                               : std::vector<std::pair<std::string, int>>{{"reward", 3}},
      [algorithm](const std::vector<std::string>& args) {
        return run_estimate_online(args, algorithm);
      }};
}

}  // namespace

const TrainerSpec& grpo_spec() {
  static const TrainerSpec spec = online_spec(
      "grpo",
      "group relative policy optimisation on in-process generations (TRL GRPOTrainer options); no "
      "options: the built-in demo task");
  return spec;
}

const TrainerSpec& rloo_spec() {
  static const TrainerSpec spec = online_spec(
      "rloo", "REINFORCE leave-one-out on in-process generations (TRL RLOOTrainer options)");
  return spec;
}

const TrainerSpec& distill_spec() {
  static const TrainerSpec spec = online_spec(
      "distill",
      "on-policy distillation: the student's completions scored against a frozen teacher's "
      "distributions (TRL DistillationTrainer options; chunked divergence, no [T, V] logits)");
  return spec;
}

const TrainerSpec& online_dpo_spec() {
  static const TrainerSpec spec = online_spec(
      "online_dpo",
      "online DPO: two completions per prompt judged by the reward sources or a pairwise judge "
      "(TRL OnlineDPOTrainer options)");
  return spec;
}

}  // namespace leantune
