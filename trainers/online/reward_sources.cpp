// The online trainers' reward sources (see reward_sources.h).
#include "trainers/online/reward_sources.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "engine/check.h"
#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "models/peft_io.h"
#include "models/score_head.h"
#include "trainers/common/peft_options.h"
#include "trainers/reward/reward.h"

namespace leantune {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

const OptionTable<RewardSourceArguments>& reward_source_table() {
  using A = RewardSourceArguments;
  static const OptionTable<A> t =
      OptionTable<A>()
          .list("reward_funcs", &A::reward_funcs,
                "reward sources: accuracy_reward, format_reward, soft_overlong_punishment or a "
                "reward model folder (trainer_bin reward's output)")
          .text("reward_command", &A::reward_command,
                "an external reward process (sh -c, kept for the whole run): one JSON line "
                "{prompt, completion, columns} per completion on stdin, one answer per line on "
                "stdout, in order: a finite number, or null for no reward. Exit 2 naming the "
                "command and its output line for an answer that is not a finite number or null, "
                "more answers than inputs, its exit, or fewer answers than inputs after "
                "--reward_timeout; it runs in a process group of its own, which gets SIGTERM "
                "and, 2 s later, SIGKILL when the run ends, fails or is stopped")
          .real("reward_timeout", &A::reward_timeout,
                "seconds the reward command may take to answer one batch of completions (then "
                "exit 2)",
                0.001)
          .list("reward_weights", &A::reward_weights,
                "one weight per reward source, reward_funcs first, then reward_command (none: 1 "
                "each)")
          .text("format_pattern", &A::format_pattern,
                "format_reward's regular expression, matched from the completion's start")
          .integer("soft_punish_cache", &A::soft_punish_cache,
                   "soft_overlong_punishment: tokens before max_completion_length where the "
                   "penalty begins",
                   0);
  return t;
}

std::vector<Message> prompt_messages(const nlohmann::json& v, const std::string& where) {
  LT_CHECK_INPUT(v.is_array(), where, ": \"prompt\" is neither a string nor a message list");
  std::vector<Message> m;
  for (const auto& e : v) {
    LT_CHECK_INPUT(e.is_object() && e.contains("role") && e.contains("content") &&
                       e["role"].is_string() && e["content"].is_string(),
                   where, ": a prompt message needs string \"role\" and \"content\"");
    m.push_back({e["role"].get<std::string>(), e["content"].get<std::string>()});
  }
  LT_CHECK_INPUT(!m.empty(), where, ": the prompt message list is empty");
  return m;
}

std::string row_solution(const nlohmann::json& row) {
  for (const char* k : {"solution", "answer"}) {
    if (!row.contains(k)) continue;
    const nlohmann::json& v = row[k];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number()) return v.dump();
  }
  return "";
}

struct RewardSources::ModelSource {
  std::string path;
  std::shared_ptr<Tokenizer> tokenizer;
  std::unique_ptr<TextEncoder> encoder;
  std::unique_ptr<RewardModel> model;
};

RewardSources::RewardSources(const RewardSourceArguments& a, int64_t max_completion_length,
                             Device device, DType dtype)
    : max_len_(max_completion_length), punish_cache_(a.soft_punish_cache) {
  for (const std::string& f : a.reward_funcs) {
    if (f.empty()) continue;  // --reward_funcs "": none
    if (f == "accuracy_reward") {
      kinds_.push_back(Kind::kAccuracy);
    } else if (f == "format_reward") {
      kinds_.push_back(Kind::kFormat);
      format_ = std::make_unique<FormatReward>(a.format_pattern);
    } else if (f == "soft_overlong_punishment") {
      LT_CHECK_INPUT(punish_cache_ < max_len_, "option --soft_punish_cache ", punish_cache_,
                     " must be below max_completion_length ", max_len_);
      kinds_.push_back(Kind::kOverlong);
    } else {
      LT_CHECK_INPUT(std::filesystem::is_directory(f), "option --reward_funcs: '", f,
                     "' is neither accuracy_reward, format_reward, soft_overlong_punishment nor "
                     "a reward model folder");
      auto m = std::make_unique<ModelSource>();
      m->path = f;
      std::string tok_dir = f;
      if (is_adapter_dir(f) && !std::filesystem::exists(f + "/tokenizer.json"))
        tok_dir = resolve_base_model_path(f);
      m->tokenizer = Tokenizer::load(tok_dir);
      m->encoder = make_text_encoder(m->tokenizer);
      m->model = std::make_unique<RewardModel>(
          open_reward_model(f, device, dtype, m->encoder->pad_token_id()));
      models_.push_back(std::move(m));
      kinds_.push_back(Kind::kModel);
    }
    // TRL's metric names (rewards/<name>/mean): the reward function's __name__, a reward
    // model's folder name.
    std::string name = f == "soft_overlong_punishment" ? "soft_overlong_punishment_reward" : f;
    if (kinds_.back() == Kind::kModel) {
      const std::filesystem::path p = std::filesystem::path(f).lexically_normal();
      name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
    }
    names_.push_back(name);
  }
  if (!a.reward_command.empty()) {
    command_ = std::make_unique<RewardCommand>(a.reward_command, a.reward_timeout);
    kinds_.push_back(Kind::kCommand);
    names_.push_back("reward_command");
  }
  LT_CHECK_INPUT(!kinds_.empty(), "no reward source: give --reward_funcs and/or --reward_command");
  for (const std::string& s : a.reward_weights) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    LT_CHECK_INPUT(!s.empty() && end && *end == '\0' && std::isfinite(v),
                   "option --reward_weights: '", s, "' is not a finite number");
    weights_.push_back(v);
  }
  if (weights_.empty()) weights_.assign(kinds_.size(), 1.0);
  LT_CHECK_INPUT(weights_.size() == kinds_.size(), "option --reward_weights: ", weights_.size(),
                 " weights for ", kinds_.size(), " reward sources");
}

RewardSources::~RewardSources() = default;

bool RewardSources::needs_solution() const {
  for (Kind k : kinds_)
    if (k == Kind::kAccuracy) return true;
  return false;
}

std::vector<std::vector<double>> RewardSources::score(const std::vector<CompletionToScore>& c,
                                                      const std::function<bool()>& should_stop) {
  std::vector<std::vector<double>> r(c.size(), std::vector<double>(kinds_.size(), kNaN));
  size_t model_index = 0;
  for (size_t f = 0; f < kinds_.size(); ++f) {
    switch (kinds_[f]) {
      case Kind::kAccuracy:
        for (size_t i = 0; i < c.size(); ++i)
          r[i][f] = accuracy_reward(c[i].completion, row_solution(*c[i].row));
        break;
      case Kind::kFormat:
        for (size_t i = 0; i < c.size(); ++i) r[i][f] = (*format_)(c[i].completion);
        break;
      case Kind::kOverlong:
        for (size_t i = 0; i < c.size(); ++i)
          r[i][f] = soft_overlong_punishment(c[i].completion_tokens, max_len_, punish_cache_);
        break;
      case Kind::kModel: {
        ModelSource& m = *models_[model_index++];
        std::vector<std::vector<int32_t>> seqs;
        for (const CompletionToScore& x : c) {
          const nlohmann::json& p = (*x.row)["prompt"];
          if (p.is_string()) {
            seqs.push_back(m.encoder->encode(p.get<std::string>() + x.completion, false));
          } else {
            std::vector<Message> msgs = prompt_messages(p, "prompt");
            msgs.push_back({"assistant", x.completion});
            seqs.push_back(m.encoder->encode(m.encoder->render_chat(msgs, false), false));
          }
          LT_CHECK_INPUT(!seqs.back().empty(), m.path, ": nothing to score (no tokens)");
        }
        const std::vector<double> s = m.model->score_sequences(seqs);
        for (size_t i = 0; i < c.size(); ++i) r[i][f] = s[i];
        break;
      }
      case Kind::kCommand: {
        std::vector<nlohmann::json> rows;
        for (const CompletionToScore& x : c) {
          nlohmann::json j = *x.row;
          j["completion"] = x.completion;
          rows.push_back(std::move(j));
        }
        const std::vector<double> s = command_->score(rows, should_stop);
        for (size_t i = 0; i < c.size(); ++i) r[i][f] = s[i];
        break;
      }
    }
  }
  return r;
}

double RewardSources::total(const std::vector<double>& per_source) const {
  double sum = 0;
  bool any = false;
  for (size_t f = 0; f < per_source.size(); ++f)
    if (!std::isnan(per_source[f])) {
      sum += weights_[f] * per_source[f];
      any = true;
    }
  return any ? sum : kNaN;
}

}  // namespace leantune
