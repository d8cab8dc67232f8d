// OnlineTrainer::generate_and_score: one batch of prompts completed num_generations times by the
// policy (models/generate.h, on the weights being trained), scored by the reward sources, given
// its old and reference log-probabilities and its advantages, with TRL's metrics of the batch.
// Training's generation batches and the evaluation's batches both come from here (grpo.h).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "trainers/common/peft_options.h"
#include "trainers/online/grpo.h"

namespace leantune {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The completion's text as transformers decodes it (skip_special_tokens): ids the tokenizer does
// not know (a model's vocabulary padded past the tokenizer's) decode to nothing, as the Rust
// tokenizers' decode drops them.
std::string decode_completion(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<int32_t> known;
  for (int32_t id : ids)
    if (id >= 0 && id < tok.vocab_size()) known.push_back(id);
  return tok.decode(known, true);
}

// Every rank's `local` values (all ranks hold as many) in rank order; `local` on one process.
std::vector<double> gather_ranks(Communicator& comm, const std::vector<double>& local) {
  if (comm.size() == 1) return local;
  const size_t n = local.size();
  std::vector<double> all(n * static_cast<size_t>(comm.size()), 0.0);
  std::copy(local.begin(), local.end(), all.begin() + static_cast<int64_t>(n) * comm.rank());
  // A sum where every other rank adds zeros: exact, NaN included.
  Tensor t = Tensor::from_doubles(all, {static_cast<int64_t>(all.size())}, DType::kF64);
  comm.all_reduce(t);
  return t.to_f64();
}

}  // namespace

OnlineTrainer::ScoredBatch OnlineTrainer::generate_and_score(const OnlinePrompts& prompts,
                                                             const std::vector<int64_t>& idx,
                                                             uint64_t seed,
                                                             const std::string& label,
                                                             bool training) {
  const auto start = std::chrono::steady_clock::now();
  // One process: a stop signal ends the phase between decode steps, between reference batches and
  // while a reward command is awaited (StopRequested; the trainer saves its last completed update).
  // Data parallel: the ranks finish the phase together and stop between micro-batches.
  std::function<bool()> should_stop;
  // An evaluation runs to its end; the loop honours a stop after it.
  if (training && comm().size() == 1) should_stop = [] { return stop_requested(); };
  const int64_t g = cfg_.num_generations;
  std::vector<Rollout> all;
  std::vector<std::vector<int32_t>> prompt_ids;
  for (int64_t i : idx)
    for (int64_t k = 0; k < g; ++k) {
      prompt_ids.push_back(prompts.rows[static_cast<size_t>(i)].ids);
      all.push_back(Rollout{});
      all.back().row = &prompts.rows[static_cast<size_t>(i)];
    }
  // Generation: no gradient, adapter dropout off, a seed of its own per generation batch (each
  // completion then draws from its own Philox stream, models/generate.h). distill with lmbda < 1
  // (GKD): with probability 1 - lmbda the batch is off-policy instead, drawn from the batch's
  // seed so every rank draws alike (evaluation always is): the dataset's completions, or with
  // seq_kd the teacher's, sampled as the student's would be (a pool of their own, freed after).
  GenerationResult gen;
  const bool off_policy = cfg_.algorithm == "distill" && cfg_.distill_lmbda < 1.0 &&
                          (!training || distill_off_policy_draw(seed) > cfg_.distill_lmbda);
  const bool by_teacher = off_policy && cfg_.distill_seq_kd;
  if (off_policy && !by_teacher) {
    for (const Rollout& r : all) {
      gen.tokens.push_back(r.row->completion);
      gen.finished_by_eos.push_back(!r.row->completion_cut);
    }
  } else {
    StepPhaseGuard phase("generation");
    NoGradGuard ng;
    AdapterEvalScope eval(peft_);
    Allocator& al = allocator(model_->device());
    if (generations_ > 0) close_optimizer_window(optimizer_peak_);
    al.begin_window();
    GenerationConfig gc = cfg_.generation;
    gc.seed = seed;
    // Data parallel: completions are numbered across the ranks, as one process numbers them.
    gc.first_sequence = static_cast<int64_t>(prompt_ids.size()) * comm().rank();
    gc.should_stop = should_stop;
    if (by_teacher) {
      MemSiteGuard site("teacher");
      gen = generate(*teacher_, prompt_ids, gc, nullptr);
    } else {
      if (!kv_pool_)
        kv_pool_ =
            std::make_unique<PagedKVCache>(model_->config(), model_->num_layers(), model_->dtype(),
                                           model_->device(), cfg_.kv_block_size, kv_blocks_);
      // ZeRO-3: the whole model for the phase, or each layer for each step (models/decoder.h
      // ParamUse inside the engine); the same tokens either way.
      Zero3Params* z3 = zero3();
      const bool gather_all = z3 && cfg_.ds3_gather_for_generation;
      if (gather_all) z3->acquire_all();
      gen = generate(*model_, prompt_ids, gc, kv_pool_.get());
      if (gather_all) z3->release_all();
      if (cfg_.sleep_mode) {
        const int64_t before = al.stats().reserved.current;
        kv_pool_->sleep();
        sleep_released_ = std::max(sleep_released_, before - al.stats().reserved.current);
      }
    }
    const AllocatorStats st = al.stats();
    generation_peak_.allocated = std::max(generation_peak_.allocated, st.window_allocated.peak);
    generation_peak_.reserved = std::max(generation_peak_.reserved, st.window_reserved.peak);
    al.begin_window();
  }
  if (gen.interrupted) throw StopRequested();
  const double gen_s = seconds_since(start);

  // Rewards.
  const auto reward_start = std::chrono::steady_clock::now();
  std::vector<CompletionToScore> to_score;
  for (size_t k = 0; k < all.size(); ++k) {
    Rollout& r = all[k];
    r.completion = gen.tokens[k];
    const bool eos = gen.finished_by_eos[k];
    r.mask.assign(r.completion.size(), (cfg_.mask_truncated_completions && !eos) ? 0 : 1);
    const int64_t n = static_cast<int64_t>(r.completion.size());
    to_score.push_back({&r.row->row, decode_completion(*tokenizer_, r.completion), n});
  }
  // Under a judge (online_dpo --judge) there are no rewards: the judge's verdicts choose.
  std::vector<std::vector<double>> per_source;
  std::vector<double> rewards(all.size(), std::nan(""));
  std::vector<int> verdicts;
  if (rewards_) {
    per_source = rewards_->score(to_score, should_stop);
    for (size_t k = 0; k < all.size(); ++k) rewards[k] = rewards_->total(per_source[k]);
  } else if (judge_) {
    std::vector<JudgePair> pairs;
    for (size_t k = 0; k + 1 < all.size(); k += 2)
      pairs.push_back({to_score[k].row, to_score[k].completion, to_score[k + 1].completion,
                       to_score[k].completion_tokens, to_score[k + 1].completion_tokens});
    verdicts = judge_->judge(pairs, should_stop);
  }
  const double reward_s = seconds_since(reward_start);

  // Old and reference log-probabilities, micro-batch by micro-batch, before shuffling.
  const auto ref_start = std::chrono::steady_clock::now();
  const bool rloo = cfg_.algorithm == "rloo", dpo = cfg_.algorithm == "online_dpo";
  const bool per_token = !rloo && !dpo;  // grpo scores tokens; rloo and online_dpo sequences
  const bool need_old =
      rloo ||
      (per_token && (cfg_.num_iterations > 1 || cfg_.steps_per_generation > accumulation_steps()));
  const bool need_ref = cfg_.loss.beta != 0.0 || dpo;
  if (need_old || need_ref) {
    StepPhaseGuard phase("reference");
    NoGradGuard ng;
    SequenceLogpsOptions lo = cfg_.logps;
    lo.per_token = per_token;
    lo.gradient_checkpointing = false;
    const size_t mb = static_cast<size_t>(cfg_.completions_per_micro_batch);
    for (size_t b0 = 0; b0 < all.size(); b0 += mb) {
      if (should_stop && should_stop()) throw StopRequested();
      std::vector<Rollout> part(all.begin() + static_cast<int64_t>(b0),
                                all.begin() + static_cast<int64_t>(std::min(all.size(), b0 + mb)));
      const Batch batch = collate(part);
      std::vector<double> old_rows, ref_rows;
      if (need_old) {
        AdapterEvalScope eval(peft_);
        old_rows = sequence_logps(*model_, batch, lo).logps.to_f64();
      }
      if (need_ref) ref_rows = ref_->logps(batch, {}, lo);
      for (size_t i = 0; i < part.size(); ++i) {
        Rollout& r = all[b0 + i];
        if (!per_token) {
          if (need_old) r.old_sum = old_rows[i];
          if (need_ref) r.ref_sum = ref_rows[i];
        }
      }
      if (per_token) {
        const auto old_v =
            need_old ? completion_values(part, old_rows) : std::vector<std::vector<double>>();
        const auto ref_v =
            need_ref ? completion_values(part, ref_rows) : std::vector<std::vector<double>>();
        for (size_t i = 0; i < part.size(); ++i) {
          if (need_old) all[b0 + i].old_logp = old_v[i];
          if (need_ref) all[b0 + i].ref_logp = ref_v[i];
        }
      }
    }
  }
  const double ref_s = seconds_since(ref_start);

  // Advantages and metrics over the whole generation batch: data parallel, every rank holds
  // whole groups, and the ranks' values are gathered in rank order (TRL gathers them too), so
  // the batch std and every metric are the single-process ones; each rank keeps its slice.
  Communicator& comm = this->comm();
  const size_t n_local = all.size(), first = n_local * static_cast<size_t>(comm.rank());
  std::vector<double> lengths, eos, kl(n_local, 0.0), kl_tok(n_local, 0.0);
  for (size_t k = 0; k < n_local; ++k) {
    lengths.push_back(static_cast<double>(all[k].completion.size()));
    eos.push_back(gen.finished_by_eos[k] ? 1.0 : 0.0);
    if (rloo && need_ref) {
      kl[k] = all[k].old_sum - all[k].ref_sum;
      for (uint8_t x : all[k].mask) kl_tok[k] += x;
    }
  }
  const std::vector<double> rewards_g = gather_ranks(comm, rewards),
                            lengths_g = gather_ranks(comm, lengths),
                            eos_g = gather_ranks(comm, eos), kl_g = gather_ranks(comm, kl),
                            kl_tok_g = gather_ranks(comm, kl_tok);
  if (rewards_) check_rewards(rewards_g, all, label);
  // RLOO: the KL penalty enters the reward first.
  std::vector<double> adv_rewards = rewards_g;
  if (rloo && need_ref)
    for (size_t k = 0; k < adv_rewards.size(); ++k) adv_rewards[k] -= cfg_.loss.beta * kl_g[k];
  // online_dpo: missing_eos_penalty first, then the better of each two is chosen.
  std::vector<double> judged = rewards_g;
  int64_t no_verdict = 0;
  if (dpo && judge_) {
    // TRL: the first is chosen when the rank is 0; 1 or no verdict (-1) take the second.
    for (size_t k = 0; k < n_local; ++k) {
      const int rank = verdicts[k / 2];
      if (k % 2 == 0 && rank < 0) ++no_verdict;
      all[k].reward = std::nan("");
      all[k].chosen = (k % 2 == 0) == (rank == 0);
    }
  } else if (dpo) {
    for (size_t k = 0; k < judged.size(); ++k)
      if (cfg_.missing_eos_penalty > 0 && eos_g[k] == 0.0) judged[k] -= cfg_.missing_eos_penalty;
    for (size_t k = 0; k < n_local; ++k) {
      const size_t a = first + (k & ~size_t{1}), b = a + 1;
      all[k].reward = judged[first + k];
      // TRL compares with >=: a NaN on either side makes the second one chosen.
      all[k].chosen = (k % 2 == 0) == (judged[a] >= judged[b]);
    }
  } else if (rewards_) {  // grpo, rloo (distill has no rewards)
    const std::vector<double> adv = rloo
                                        ? rloo_advantages(adv_rewards, g, cfg_.normalize_advantages)
                                        : grpo_advantages(adv_rewards, g, cfg_.scale_rewards);
    for (size_t k = 0; k < n_local; ++k) all[k].advantage = adv[first + k];
  }

  // The generation batch's metrics (TRL's names; the rewards as the sources gave them, before
  // RLOO's KL penalty).
  nlohmann::json m = nlohmann::json::object();
  // TRL 1.16: the mean and std (NaN-aware) over the whole generation batch. A judge gives no
  // rewards, and TRL then logs none of the reward metrics.
  const auto [mean, spread] = nan_mean_std(rewards_g, 0, rewards_g.size());
  if (rewards_) {
    m["reward"] = nan_as_null(mean);
    m["reward_std"] = nan_as_null(spread);
  }
  // frac_reward_zero_std over the stds the advantages used: each group's (rloo's after its KL
  // penalty), or the whole batch's under scale_rewards batch. A NaN std (one scorable reward) is
  // not zero, as torch.isclose says.
  std::vector<double> stds;
  if (cfg_.scale_rewards == "batch" && !rloo && !dpo) {
    stds.push_back(nan_mean_std(adv_rewards, 0, adv_rewards.size()).second);
  } else {
    for (size_t b = 0; b < adv_rewards.size(); b += static_cast<size_t>(g))
      stds.push_back(nan_mean_std(adv_rewards, b, b + static_cast<size_t>(g)).second);
  }
  int64_t zero_std = 0;
  for (double v : stds) zero_std += !std::isnan(v) && std::abs(v) <= 1e-8 ? 1 : 0;
  if (rewards_)
    m["frac_reward_zero_std"] = static_cast<double>(zero_std) / static_cast<double>(stds.size());
  if (judge_) {
    // leantune's metric: the pairs the judge gave no verdict on (their second completion was
    // taken), every rank's.
    const std::vector<double> nv = gather_ranks(comm, std::vector<double>{double(no_verdict)});
    double sum = 0;
    for (double v : nv) sum += v;
    m["judge/no_verdict"] = sum;
  }
  for (size_t f = 0; rewards_ && f < rewards_->names().size(); ++f) {
    std::vector<double> col;
    for (const auto& row : per_source) col.push_back(row[f]);
    const std::vector<double> all_col = gather_ranks(comm, col);
    const auto [fm, fs] = nan_mean_std(all_col, 0, all_col.size());
    m["rewards/" + rewards_->names()[f] + "/mean"] = nan_as_null(fm);
    m["rewards/" + rewards_->names()[f] + "/std"] = nan_as_null(fs);
  }
  const double n_all = static_cast<double>(lengths_g.size());
  double len_sum = 0, len_min = 1e300, len_max = 0, terminated = 0, terminated_sum = 0;
  double term_min = 1e300, term_max = 0;
  for (size_t k = 0; k < lengths_g.size(); ++k) {
    len_sum += lengths_g[k];
    len_min = std::min(len_min, lengths_g[k]);
    len_max = std::max(len_max, lengths_g[k]);
    terminated += eos_g[k];
    terminated_sum += eos_g[k] * lengths_g[k];
    if (eos_g[k] != 0.0) {
      term_min = std::min(term_min, lengths_g[k]);
      term_max = std::max(term_max, lengths_g[k]);
    }
  }
  // distill with lmbda < 1: whether the batch was generated (1) or the dataset's (0).
  if (cfg_.algorithm == "distill" && cfg_.distill_lmbda < 1.0) m["on_policy"] = off_policy ? 0 : 1;
  m["completions/mean_length"] = len_sum / n_all;
  m["completions/min_length"] = len_min;
  m["completions/max_length"] = len_max;
  m["completions/clipped_ratio"] = (n_all - terminated) / n_all;
  // No completion ended with eos: TRL logs 0 for the three.
  m["completions/mean_terminated_length"] = terminated > 0 ? terminated_sum / terminated : 0.0;
  m["completions/min_terminated_length"] = terminated > 0 ? term_min : 0.0;
  m["completions/max_terminated_length"] = terminated > 0 ? term_max : 0.0;
  if (rloo && need_ref) {
    double kl_sum = 0, kl_tokens = 0;
    for (size_t k = 0; k < kl_g.size(); ++k) {
      kl_sum += kl_g[k];
      kl_tokens += kl_tok_g[k];
    }
    m["kl"] = kl_tokens > 0 ? kl_sum / kl_tokens : 0.0;
  }
  if (dpo) {
    double scores = 0, margin = 0;
    for (size_t k = 0; k < judged.size(); k += 2) {
      scores += judged[k] + judged[k + 1];
      margin += std::abs(judged[k] - judged[k + 1]);  // chosen minus rejected
    }
    if (rewards_) {  // TRL logs the scores with reward functions only
      m["objective/scores"] = nan_as_null(scores / n_all);
      m["objective/scores_margin"] = nan_as_null(margin / (n_all / 2));
    }
    m["val/contain_eos_token"] = terminated / n_all;
    // Not a TRL metric: the share of sequences whose prompt max_length cut (counted, not silent).
    double cut = 0;
    for (const Rollout& r : all)
      cut += prompt_cut(r.row->ids.size(), r.completion.size()) > 0 ? 1.0 : 0.0;
    m["val/prompt_truncated_ratio"] = comm.all_reduce_scalar(cut) / n_all;
  }
  if (training) {
    m["timing/generation_s"] = gen_s;
    m["timing/reward_s"] = reward_s;
    m["timing/reference_s"] = ref_s;
  }
  // The loss tokens of the batch: dapo's normaliser counts every rank's.
  int64_t tokens = 0;
  for (const Rollout& r : all)
    for (uint8_t x : r.mask) tokens += x;
  return {std::move(all), std::move(m), comm.all_reduce_int(tokens)};
}

}  // namespace leantune
