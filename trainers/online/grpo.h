// The online trainers trainer_bin grpo, rloo, online_dpo and distill, one OnlineTrainer (TRL
// GRPOTrainer / RLOOTrainer / OnlineDPOTrainer / DistillationTrainer option names and defaults):
// generate from the policy being trained, score, and update on the scored completions. The
// generation engine is models/generate.h, run on the very weights being trained (LoRA applied on
// the fly, no merged copy, no weight sync).
//
// Data: JSONL rows with a "prompt" column (a string, or a message list rendered with the chat
// template and an assistant generation prompt); every other column goes to the reward sources
// (trainers/online/reward_sources.h). No dataset and no model: the built-in task (below).
//
// Batches, as TRL's RepeatSampler lays them out: per_device_train_batch_size completions per
// micro-batch; one generation batch = per_device_train_batch_size x steps_per_generation
// (default: gradient_accumulation_steps) completions = that / num_generations prompts, each
// completed num_generations times. The generation batch is scored, its advantages formed
// (trainers/online/grpo_loss.h), shuffled and cut into steps_per_generation micro-batches, which
// are used num_iterations times before the next generation. A micro-batch is a flat varlen Batch of
// prompt + completion sequences, labels = the completion tokens under the completion mask (up to
// and including the first eos; with mask_truncated_completions, nothing of a completion that hit
// max_completion_length).
//
// grpo: per-token log-probabilities (logits / temperature), old log-probabilities kept from
//   generation when num_iterations > 1 or steps_per_generation > gradient_accumulation_steps
//   (else the detached current ones), the reference's (beta != 0; adapters off, a policy copy or
//   --ref_model: models/ref_model.h) taken at generation, loss_type grpo|bnpo|dr_grpo|dapo.
// rloo: per-sequence sums; the reward less beta x (old - ref) summed over the completion, the
//   leave-one-out baseline (normalize_advantages optional), and the sequence-level clipped
//   ratio, mean over sequences, over gradient accumulation.
// online_dpo (TRL's experimental OnlineDPOTrainer): per_device_train_batch_size prompts per
//   micro-batch, two completions each, generated for every micro-batch; the one with the higher
//   reward (ties: the first) is chosen, or, with --judge, the one a pairwise judge prefers
//   (trainers/online/judges.h; no verdict: the second, as TRL); the DPO loss (sigmoid or ipo) on
//   the summed log-probabilities against the reference, mean over pairs.
// Rewards that are not finite (an infinite weighted sum, or a group's mean or std beyond a
// double) make every update on their generation batch a non-finite step: a warning, skipped,
// counted, and the run stops with exit 4 after max_consecutive_nonfinite in a row (trainer.h).
// Completions that no source scored (all null) are a warning each generation batch; their
// advantage is 0 (TRL's).
// distill (TRL 1.16's DistillationTrainer, trainers/online/distill.h): one completion per
//   prompt, generation batch per_device_train_batch_size x gradient_accumulation_steps; the
//   divergence between the student's and a frozen teacher's distributions on the completion
//   tokens, summed and divided by the generation batch's completion tokens.
// Metrics (metrics.jsonl): reward, reward_std, rewards/<source>/{mean,std}, frac_reward_zero_std,
// completions/{mean,min,max}_length, completions/clipped_ratio, completions/
// mean_terminated_length, clip_ratio/*, kl (beta != 0), entropy, and the time of each phase
// (timing/{generation,reward,reference,optimization}_s).
// Evaluation (--eval_dataset): the evaluation prompts in batches generated and scored as in
// training (online_generation.cpp), logged as eval_<metric> with eval_loss (evaluate()).
//
// Built-in task (no --dataset): "Add a and b." prompts with a, b in [0, 9] (100 prompts) and their
// sum in "answer"; rewards format_reward (^ *[0-9]) and accuracy_reward on the built-in demo model.
//
// Data parallel (mpirun): each rank completes its share of the generation batch's prompts (whole
// groups; completions numbered across the ranks), rewards and lengths are gathered in rank
// order for the advantages and metrics, dapo's normaliser counts every rank's tokens, and each
// rank's loss is divided by the world size (the trainer sums gradients where DDP averages).
// Only whole generation batches are used in an epoch (TRL's RepeatSampler drops the rest).
// Memory between phases: the generation engine's paged KV-cache pool (kv_cache_blocks of
// kv_block_size tokens) is made once and kept; with vllm_enable_sleep_mode (alias
// generation_sleep) it is freed after every generation phase together with the allocator's cached
// blocks, and made again at the next. The memory report gives each phase's peak.
// ZeRO-3 (zero_stage 3): with ds3_gather_for_generation (default) the whole model is gathered
// once for each generation phase; without, the engine gathers each layer for each step.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "models/generate.h"
#include "models/offloaded_weights.h"
#include "models/ref_model.h"
#include "trainers/common/model_source.h"
#include "trainers/common/row_batches.h"
#include "trainers/common/trainer.h"
#include "trainers/online/grpo_loss.h"
#include "trainers/online/judges.h"
#include "trainers/online/reward_sources.h"
#include "trainers/sft/sft.h"

namespace leantune {

// The options of grpo, rloo and online_dpo as given (TRL's names). Each command declares the
// fields it has (online_table): online_dpo max_new_tokens, loss_type sigmoid|ipo, max_length and
// missing_eos_penalty; grpo and rloo num_generations, max_completion_length,
// steps_per_generation, num_iterations, the epsilons and mask_truncated_completions, and grpo
// also loss_type and scale_rewards, rloo normalize_advantages. The member defaults are grpo's;
// online_arguments_defaults gives each command's.
struct OnlineArguments : ModelSource {
  int64_t max_new_tokens = 64;
  int64_t num_generations = 8;
  int64_t max_completion_length = 512;
  std::optional<int64_t> steps_per_generation;  // none: gradient_accumulation_steps
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double beta = 0.0;
  std::string loss_type = "dapo";
  int64_t max_length = 512;
  double missing_eos_penalty = 0.0;
  int64_t num_iterations = 1;
  double epsilon = 0.2;
  double epsilon_high = -1.0;  // negative: epsilon
  std::string scale_rewards = "group";
  bool use_bias_correction_kl = true;  // grpo: the KL term times the importance ratio (TRL 1.16)
  bool normalize_advantages = false;
  bool mask_truncated_completions = false;
  bool vllm_enable_sleep_mode = false;
  int64_t kv_cache_blocks = 0;
  int64_t kv_block_size = 16;
  bool ds3_gather_for_generation = true;
  bool use_liger_loss = true;
  std::string judge;  // online_dpo: a pairwise judge instead of the reward sources (judges.h)
  std::string teacher_model_name_or_path;  // distill: the frozen teacher (empty: the demo's)
  bool teacher_load_in_4bit = false;       // distill: the teacher's linear weights in NF4
  bool teacher_load_in_8bit = false;       // distill: the teacher's linear weights in int8
  bool teacher_offload = false;            // distill: the teacher's layers in pinned host memory
  double lmbda = 1.0;                      // distill: the share of on-policy batches (GKD's lmbda)
  bool seq_kd = false;  // distill: off-policy batches generated by the teacher (GKD)
  std::string teacher_model_revision = "main";  // distill: the teacher's Hub revision
  std::string teacher_model_init_kwargs;        // distill: TRL's JSON kwargs (torch_dtype only)
  RewardSourceArguments rewards;
};
// TRL's defaults of "grpo", "rloo" or "online_dpo" (GRPOConfig, RLOOConfig, OnlineDPOConfig:
// num_generations 8 / 2, beta 0 / 0.05 / 0.1, online_dpo's temperature 0.9 and sigmoid loss).
OnlineArguments online_arguments_defaults(const std::string& algorithm);
// The options above that `algorithm` declares, in its --help order, then the reward sources'.
const OptionTable<OnlineArguments>& online_table(const std::string& algorithm);
// Every option of that command: online_table's, then the reference model's, chat, PEFT,
// quantization and training options.
Options online_options(const std::string& algorithm);

struct PromptRow {
  int64_t line = 0;
  nlohmann::json row;        // every column
  std::vector<int32_t> ids;  // the prompt's tokens
  // distill with lmbda < 1: the dataset's completion tokens (attach_dataset_completions), and
  // whether max_completion_length cut them.
  std::vector<int32_t> completion;
  bool completion_cut = false;
};
struct OnlinePrompts {
  std::string path;
  std::vector<PromptRow> rows;
  bool conversational = false;
  std::string completions_summary;  // attach_dataset_completions' line (distill, lmbda < 1)
  std::string summary() const;
};
// Error(kInput) (exit 2) naming the file and line for a row without a prompt, or without the
// solution column when `need_solution`.
// `source`: a JSONL file or rows in memory (loaders/jsonl.h).
OnlinePrompts load_online_prompts(const JsonlSource& source, const TextEncoder& enc,
                                  bool need_solution);
// distill --lmbda < 1 (GKD's off-policy batches): reads `source` again as prompt_completion rows
// and gives each prompt row the completion tokens TRL's SFT tokenization gives it (ids =
// encode(prompt + completion + eos unless it ends with it), or the chat template over prompt +
// completion messages; the completion is what follows the common prefix with the prompt's ids),
// cut to max_completion_length. Error(kInput) naming the file when its rows are not
// prompt_completion. Sets prompts.completions_summary (part of summary()): the completions, their
// tokens, how many were cut and how many prompts tokenized differently inside prompt +
// completion (TRL's prompt mismatch).
void attach_dataset_completions(OnlinePrompts& prompts, const JsonlSource& source,
                                const TextEncoder& enc, int64_t max_completion_length);
// distill's teacher dtype: --teacher_model_init_kwargs' "torch_dtype" (or "dtype": a dtype name,
// or "auto": config.json's torch_dtype in `teacher_dir`), else the student's. Error(kInput)
// naming the option for a value that is not a JSON object, a bad dtype, or any other key (the
// other from_pretrained kwargs have no meaning here).
DType distill_teacher_dtype(const std::string& init_kwargs, DType student,
                            const std::string& teacher_dir);
// The uniform draw in [0, 1) that decides whether generation batch `seed` is off-policy.
double distill_off_policy_draw(uint64_t seed);

// The built-in task's rows: every "Add a and b." with a, b in [0, 9], and its answer.
std::vector<nlohmann::json> builtin_task_rows();
OnlinePrompts builtin_online_prompts(const TextEncoder& enc);

struct OnlineConfig {
  std::string algorithm = "grpo";  // grpo | rloo | online_dpo | distill
  // distill: the divergence (0 forward KL, 1 reverse KL, between: the generalized JSD) and the
  // temperature both distributions are taken at (kernels/linear_divergence.h).
  double distill_beta = 1.0;
  double distill_temperature = 1.0;
  double distill_lmbda = 1.0;   // the share of on-policy generation batches (GKD's lmbda)
  bool distill_seq_kd = false;  // off-policy batches: the teacher's completions (GKD's seq_kd)
  int64_t completions_per_micro_batch = 8;
  int64_t num_generations = 8;
  int64_t steps_per_generation = 1;
  int64_t num_iterations = 1;
  GenerationConfig generation;  // max_new_tokens = max_completion_length
  GrpoLossConfig loss;  // loss_type, epsilons, beta, use_bias_correction_kl, max_completion_length
  std::string scale_rewards = "group";
  bool normalize_advantages = false;  // rloo
  bool mask_truncated_completions = false;
  SequenceLogpsOptions logps;  // fused (use_liger_loss), temperature
  // online_dpo: the DPO loss on each prompt's two completions (loss.beta is its beta).
  std::string dpo_loss_type = "sigmoid";  // sigmoid | ipo
  double missing_eos_penalty = 0;
  int64_t max_length = 0;  // online_dpo: prompt + completion scored (0 = all)
  // The generation engine's KV-cache pool (models/kv_cache.h), kept between generation phases.
  int64_t kv_cache_blocks = 0;  // 0: a whole generation batch at the longest prompt
  int64_t kv_block_size = 16;
  bool sleep_mode = false;  // vllm_enable_sleep_mode: the pool sleeps outside generation
  bool ds3_gather_for_generation = true;  // zero_stage 3: the whole model for each generation
};

// One scored completion of the current generation batch.
struct Rollout {
  const PromptRow* row = nullptr;  // its prompt (in the training or the evaluation data)
  std::vector<int32_t> completion;
  std::vector<uint8_t> mask;        // per completion token
  std::vector<double> old_logp;     // per completion token (grpo; empty: current, detached)
  std::vector<double> ref_logp;     // per completion token (grpo with beta)
  double old_sum = 0, ref_sum = 0;  // rloo, online_dpo (ref)
  double advantage = 0;
  double reward = 0;    // online_dpo: the total reward (after missing_eos_penalty)
  bool chosen = false;  // online_dpo: the better of its prompt's two completions
  // Its generation batch's rewards are not finite (nonfinite_rewards): the loss is made NaN, so
  // that the trainer skips the update, warns and counts it (max_consecutive_nonfinite).
  bool nonfinite_reward = false;
};

class OnlineTrainer final : public Trainer {
 public:
  OnlineTrainer(TrainingArguments args, std::shared_ptr<DecoderModel> model, Options options,
                std::shared_ptr<Tokenizer> tokenizer, std::string tokenizer_dir, OnlinePrompts data,
                OnlineConfig cfg, std::unique_ptr<RewardSources> rewards);
  void set_reference(RefModelConfig cfg);
  // Evaluation prompts (--eval_dataset, with the columns the reward sources read).
  void set_eval_data(OnlinePrompts eval) { eval_ = std::move(eval); }
  // online_dpo --judge: the pairs' verdicts come from it (the trainer then has no rewards).
  void set_judge(std::unique_ptr<PairwiseJudge> judge) { judge_ = std::move(judge); }
  // distill: the frozen teacher whose next-token distributions the student learns.
  // offload: the teacher's layer residency when its layers live in host memory (else null).
  void set_teacher(std::shared_ptr<const DecoderModel> teacher,
                   std::shared_ptr<OffloadedWeights> offload = nullptr) {
    teacher_ = std::move(teacher);
    teacher_offload_ = std::move(offload);
  }
  const DataStats& train_stats() const override { return stats_; }
  const std::vector<nlohmann::json>& logged_metrics() const override { return window_.logged(); }

 protected:
  int64_t micro_batches_per_epoch() const override;
  Batch next_micro_batch(BatchReport* report) override;
  int64_t loss_tokens(const Batch& b) const override { return b.stats.label_tokens; }
  Tensor compute_loss(const Batch& b, double normalizer) override;
  void discard_micro_batches(size_t count) override;
  double epoch_progress() const override;
  nlohmann::json data_state() const override;
  void set_data_state(const nlohmann::json& s) override;
  void on_train_begin(MetricsLogger& log) override;
  nlohmann::json technique_savings() const override;
  nlohmann::json log_metrics() override;
  // TRL's evaluation: the eval prompts generated and scored in batches as in training, eval_loss
  // and the training metrics (reward, rewards/*, completions/*, kl, entropy, ...) of each batch,
  // averaged over batches. Data parallel: each rank completes per_device_eval_batch_size of a
  // global batch (the last one padded with the first prompts, as a distributed sampler pads),
  // and every metric is the ranks' mean, the same on all of them.
  std::optional<nlohmann::json> evaluate() override;
  bool has_evaluation() const override { return eval_.has_value(); }

 private:
  // The next generation batch of the training prompts, into buffer_ (generate_and_score, then
  // shuffled and cut into micro-batches).
  void generate_batch();
  // A batch of `prompts`' rows `idx`, each completed num_generations times (sampling seed
  // `seed`), scored, with old and reference log-probabilities and advantages
  // (trainers/online/online_generation.cpp); `label` names it in warnings; `training`: a stop
  // signal may end it and its phase timings are among the metrics.
  struct ScoredBatch {
    std::vector<Rollout> rollouts;
    nlohmann::json metrics;   // TRL's metrics of the batch
    int64_t loss_tokens = 0;  // completion tokens under the mask, every rank's
  };
  ScoredBatch generate_and_score(const OnlinePrompts& prompts, const std::vector<int64_t>& idx,
                                 uint64_t seed, const std::string& label, bool training);
  // What a loss of the online trainers divides by and where its metrics go: training's
  // accumulation x world size and generation batch, or an evaluation batch's (1, its tokens).
  struct LossContext {
    double divisor;                       // the loss is a mean over this many micro-batch losses
    double dapo_tokens;                   // dapo's normaliser for one micro-batch
    const nlohmann::json* batch_metrics;  // the batch's metrics, merged into each record
    MetricWindow* window;                 // the record goes here, or
    nlohmann::json* record = nullptr;     // here when window is null
  };
  // trainers/online/online_memory.cpp: the KV-cache pool's blocks (refused when one completion
  // cannot fit), and the check that a generation batch fits the device and the host (exit 3 naming
  // the options and the numbers), made before the first generation.
  int64_t plan_kv_blocks() const;
  void check_generation_memory() const;
  std::string generation_batch_options() const;
  Batch collate(const std::vector<Rollout>& rs) const;
  // Prompt tokens dropped from the front so that prompt + completion fit cfg_.max_length.
  size_t prompt_cut(size_t prompt, size_t completion) const;
  // Per completion token log-probabilities of the rollouts' tokens in `b` from per-row values.
  std::vector<std::vector<double>> completion_values(const std::vector<Rollout>& rs,
                                                     const std::vector<double>& rows) const;
  // grpo's and rloo's loss of one micro-batch.
  Tensor policy_loss(const Batch& b, const std::vector<Rollout>& rs, const LossContext& ctx);
  // online_dpo's loss of one micro-batch (pairs adjacent, one chosen and one rejected each).
  Tensor online_dpo_loss(const Batch& b, const std::vector<Rollout>& rs, const LossContext& ctx);
  // distill's loss of one micro-batch (trainers/online/distill.cpp): the divergence summed over
  // its completion tokens, divided by the generation batch's (TRL's num_items_in_batch).
  Tensor distill_loss(const Batch& b, const LossContext& ctx);
  // Warns about a batch's rewards (`label` names it): completions without any, or rewards that
  // are not finite (then flagged, see Rollout::nonfinite_reward).
  void check_rewards(const std::vector<double>& rewards_g, std::vector<Rollout>& all,
                     const std::string& label);

  std::shared_ptr<Tokenizer> tokenizer_;
  OnlinePrompts data_;
  std::optional<OnlinePrompts> eval_;
  OnlineConfig cfg_;
  std::unique_ptr<RewardSources> rewards_;  // null under a judge
  std::unique_ptr<PairwiseJudge> judge_;
  std::shared_ptr<const DecoderModel> teacher_;  // distill
  std::shared_ptr<OffloadedWeights> teacher_offload_;
  int64_t distill_rows_max_ = 0;  // distill: the largest micro-batch's rows
  std::unique_ptr<ReferenceModel> ref_;
  RowBatches prompts_;
  int64_t micro_step_ = 0;                    // micro-batches taken so far
  int64_t generations_ = 0;                   // generation batches made so far
  int64_t gen_tokens_ = 0;                    // loss tokens of the current generation batch
  std::vector<std::vector<Rollout>> buffer_;  // the generation batch's micro-batches
  std::deque<std::vector<Rollout>> pending_;  // fetched, not yet through compute_loss
  MetricWindow window_;
  nlohmann::json gen_metrics_;  // the current generation batch's metrics
  // Wall seconds from the end of one generation phase to the start of the next: the updates.
  double optimization_s_ = 0;
  std::chrono::steady_clock::time_point phase_end_;
  // The KV-cache pool, made at the first generation, and each phase's peaks (allocator windows):
  // the generation phase is the generate() call, the optimizer phase everything from its end to
  // the next one (rewards, reference scoring, updates).
  std::unique_ptr<PagedKVCache> kv_pool_;
  int64_t kv_blocks_ = 0;  // the pool's blocks (plan_kv_blocks)
  struct PhasePeaks {
    int64_t allocated = 0, reserved = 0;
  };
  PhasePeaks generation_peak_, optimizer_peak_;
  int64_t sleep_released_ = 0;  // reserved bytes one sleep gave back, at most
  void close_optimizer_window(PhasePeaks& into) const;
  DataStats stats_;
};

struct OnlineRun {
  SftModel model;
  std::unique_ptr<OnlineTrainer> trainer;
};
// Loads model, data, reward sources and reference per the options; with `model` given, trains
// that already loaded model (its model options must be those in `o`) on the inputs an embedder
// gives (public API).
OnlineRun make_online_run(const std::string& algorithm, const Options& o,
                          std::optional<SftModel> model = std::nullopt, const RunInputs& in = {});

}  // namespace leantune
