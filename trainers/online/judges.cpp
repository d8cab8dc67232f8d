// online_dpo's pairwise judges (see judges.h).
#include "trainers/online/judges.h"

#include <cmath>
#include <filesystem>

#include "engine/check.h"
#include "trainers/online/reward_sources.h"
#include "trainers/online/rewards.h"

namespace leantune {

PairwiseJudge::PairwiseJudge(const std::string& spec, double timeout_seconds, uint64_t seed,
                             Device device, DType dtype, int64_t max_completion_length)
    : spec_(spec), rng_(seed ^ 0x6a75646765ULL) {
  LT_CHECK_INPUT(!spec.empty(), "option --judge: empty");
  if (std::filesystem::is_directory(spec)) {
    LT_CHECK_INPUT(std::filesystem::exists(spec + "/config.json") ||
                       std::filesystem::exists(spec + "/adapter_config.json"),
                   "option --judge: the folder '", spec,
                   "' holds no config.json or adapter_config.json (a reward model folder, "
                   "trainer_bin reward's output)");
    RewardSourceArguments a;
    a.reward_funcs = {spec};
    model_ = std::make_unique<RewardSources>(a, max_completion_length, device, dtype);
    describe_ = "reward model " + spec;
  } else {
    command_ = std::make_unique<RewardCommand>(spec, timeout_seconds, "judge command");
    describe_ = "command '" + spec + "'";
  }
}

PairwiseJudge::~PairwiseJudge() = default;

std::vector<int> PairwiseJudge::judge(const std::vector<JudgePair>& pairs,
                                      const std::function<bool()>& should_stop) {
  ++batches_;
  std::vector<int> ranks(pairs.size(), -1);
  if (pairs.empty()) return ranks;
  if (model_) {
    std::vector<CompletionToScore> c;
    for (const JudgePair& p : pairs) {
      c.push_back({p.row, p.first, p.first_tokens});
      c.push_back({p.row, p.second, p.second_tokens});
    }
    const std::vector<std::vector<double>> s = model_->score(c, should_stop);
    for (size_t i = 0; i < pairs.size(); ++i) {
      const double a = s[2 * i][0], b = s[2 * i + 1][0];
      if (!std::isnan(a) && !std::isnan(b)) ranks[i] = a >= b ? 0 : 1;
    }
    return ranks;
  }
  std::bernoulli_distribution flip(0.5);
  std::vector<bool> flipped(pairs.size());
  std::vector<nlohmann::json> rows;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const JudgePair& p = pairs[i];
    flipped[i] = flip(rng_);
    nlohmann::json r = p.row ? *p.row : nlohmann::json::object();
    r.erase("completion");
    r["completions"] = flipped[i] ? nlohmann::json::array({p.second, p.first})
                                  : nlohmann::json::array({p.first, p.second});
    rows.push_back(std::move(r));
  }
  const std::vector<double> answers = command_->score(rows, should_stop);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const double v = answers[i];
    LT_CHECK_INPUT(std::isnan(v) || v == 0 || v == 1 || v == -1, "judge command '", spec_,
                   "': answer ", i + 1, " of batch ", batches_, " is ", v,
                   "; a judge answers 0 (the first completion is better), 1 (the second), -1 or "
                   "null (no verdict)");
    if (std::isnan(v) || v == -1) continue;
    const int r = static_cast<int>(v);
    ranks[i] = flipped[i] ? 1 - r : r;
  }
  return ranks;
}

}  // namespace leantune
