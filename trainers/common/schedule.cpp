// Learning-rate schedules (see schedule.h).
#include "trainers/common/schedule.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/check.h"

namespace leantune {

namespace {

const std::vector<std::pair<std::string, LrSchedule>>& schedules() {
  static const std::vector<std::pair<std::string, LrSchedule>> s = {
      {"linear", LrSchedule::kLinear},
      {"cosine", LrSchedule::kCosine},
      {"cosine_with_restarts", LrSchedule::kCosineWithRestarts},
      {"polynomial", LrSchedule::kPolynomial},
      {"constant", LrSchedule::kConstant},
      {"constant_with_warmup", LrSchedule::kConstantWithWarmup},
      {"inverse_sqrt", LrSchedule::kInverseSqrt},
      {"reduce_lr_on_plateau", LrSchedule::kReduceLrOnPlateau},
      {"cosine_with_min_lr", LrSchedule::kCosineWithMinLr},
      {"warmup_stable_decay", LrSchedule::kWarmupStableDecay}};
  return s;
}

// The lr_scheduler_kwargs a schedule takes (transformers' schedule functions' parameters).
std::set<std::string> accepted_kwargs(LrSchedule t) {
  switch (t) {
    case LrSchedule::kCosine:
    case LrSchedule::kCosineWithRestarts:
      return {"num_cycles"};
    case LrSchedule::kCosineWithMinLr:
      return {"num_cycles", "min_lr", "min_lr_rate"};
    case LrSchedule::kPolynomial:
      return {"lr_end", "power"};
    case LrSchedule::kInverseSqrt:
      return {"timescale"};
    case LrSchedule::kWarmupStableDecay:
      return {"num_decay_steps", "num_stable_steps", "warmup_type",
              "decay_type",      "min_lr_ratio",     "num_cycles"};
    case LrSchedule::kReduceLrOnPlateau:
      return {"mode",           "factor",   "patience", "threshold",
              "threshold_mode", "cooldown", "min_lr",   "eps"};
    default:
      return {};
  }
}

double number(const nlohmann::json& kwargs, const char* key, double def) {
  if (!kwargs.contains(key)) return def;
  const nlohmann::json& v = kwargs[key];
  LT_CHECK_INPUT(v.is_number() && std::isfinite(v.get<double>()), "option lr_scheduler_kwargs: '",
                 key, "' must be a finite number, got ", v.dump());
  return v.get<double>();
}

int64_t count(const nlohmann::json& kwargs, const char* key, int64_t def) {
  if (!kwargs.contains(key)) return def;
  const nlohmann::json& v = kwargs[key];
  LT_CHECK_INPUT(v.is_number_integer() && v.get<int64_t>() >= 0, "option lr_scheduler_kwargs: '",
                 key, "' must be a non-negative integer, got ", v.dump());
  return v.get<int64_t>();
}

std::string shape(const nlohmann::json& kwargs, const char* key, const std::string& def) {
  if (!kwargs.contains(key)) return def;
  const nlohmann::json& v = kwargs[key];
  LT_CHECK_INPUT(v.is_string() && (v == "linear" || v == "cosine" || v == "1-sqrt"),
                 "option lr_scheduler_kwargs: '", key, "' must be linear, cosine or 1-sqrt, got ",
                 v.dump());
  return v.get<std::string>();
}

// The warmup and decay curves of warmup_stable_decay over progress x in [0, 1].
double wsd_curve(const std::string& kind, double x, double num_cycles, bool warmup) {
  if (kind == "linear") return warmup ? x : 1.0 - x;
  if (kind == "cosine")
    return warmup ? 0.5 * (1.0 - std::cos(M_PI * x))
                  : 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * x));
  return warmup ? 1.0 - std::sqrt(1.0 - x) : 1.0 - std::sqrt(x);
}

}  // namespace

const std::vector<std::string>& lr_schedule_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [name, t] : schedules()) n.push_back(name);
    return n;
  }();
  return names;
}

LrSchedule parse_lr_schedule(const std::string& name) {
  for (const auto& [n, t] : schedules())
    if (n == name) return t;
  std::string all;
  for (const std::string& n : lr_schedule_names()) all += (all.empty() ? "" : ", ") + n;
  LT_THROW(ErrorKind::kInput, "lr_scheduler_type must be one of ", all, "; got '", name, "'");
}

nlohmann::json parse_lr_scheduler_kwargs(const std::string& text) {
  if (text.empty()) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  LT_CHECK_INPUT(
      !j.is_discarded() && j.is_object(),
      "option lr_scheduler_kwargs: expected a JSON object such as '{\"num_cycles\": 1}', "
      "got '",
      text, "'");
  return j;
}

LrScheduler LrScheduler::make(const std::string& type, double base_lr, int64_t total_steps,
                              int64_t warmup_steps, double warmup_ratio,
                              const nlohmann::json& kwargs) {
  LrScheduler s;
  s.type = parse_lr_schedule(type);
  s.base_lr = base_lr;
  s.total_steps = total_steps;
  s.warmup_steps =
      warmup_steps > 0
          ? warmup_steps
          : static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
  LT_CHECK_INPUT(kwargs.is_object(), "option lr_scheduler_kwargs: expected a JSON object");
  const std::set<std::string> accepted = accepted_kwargs(s.type);
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it)
    LT_CHECK_INPUT(accepted.count(it.key()), "option lr_scheduler_kwargs: '", it.key(),
                   "' is not a parameter of the ", type, " schedule");
  s.num_cycles =
      number(kwargs, "num_cycles", s.type == LrSchedule::kCosineWithRestarts ? 1.0 : 0.5);
  switch (s.type) {
    case LrSchedule::kCosineWithMinLr: {
      const bool lr = kwargs.contains("min_lr"), rate = kwargs.contains("min_lr_rate");
      LT_CHECK_INPUT(lr != rate,
                     "option lr_scheduler_kwargs: cosine_with_min_lr takes one of min_lr or "
                     "min_lr_rate");
      LT_CHECK_INPUT(rate || base_lr > 0,
                     "option lr_scheduler_kwargs: min_lr is a fraction of the learning rate, which "
                     "is 0 (give min_lr_rate)");
      s.min_lr_rate =
          rate ? number(kwargs, "min_lr_rate", 0.0) : number(kwargs, "min_lr", 0.0) / base_lr;
      break;
    }
    case LrSchedule::kPolynomial:
      s.lr_end = number(kwargs, "lr_end", 1e-7);
      s.power = number(kwargs, "power", 1.0);
      LT_CHECK_INPUT(base_lr > s.lr_end, "option lr_scheduler_kwargs: lr_end (", s.lr_end,
                     ") must be smaller than the learning rate (", base_lr, ")");
      break;
    case LrSchedule::kInverseSqrt:
      s.timescale = number(kwargs, "timescale",
                           s.warmup_steps > 0 ? static_cast<double>(s.warmup_steps) : 10000.0);
      LT_CHECK_INPUT(s.timescale > 0, "option lr_scheduler_kwargs: timescale must be positive");
      break;
    case LrSchedule::kWarmupStableDecay:
      LT_CHECK_INPUT(kwargs.contains("num_decay_steps"),
                     "option lr_scheduler_kwargs: warmup_stable_decay needs num_decay_steps");
      s.num_decay_steps = count(kwargs, "num_decay_steps", 0);
      s.num_stable_steps =
          count(kwargs, "num_stable_steps",
                std::max<int64_t>(0, total_steps - s.warmup_steps - s.num_decay_steps));
      s.warmup_type = shape(kwargs, "warmup_type", "linear");
      s.decay_type = shape(kwargs, "decay_type", "cosine");
      s.min_lr_ratio = number(kwargs, "min_lr_ratio", 0.0);
      break;
    case LrSchedule::kReduceLrOnPlateau: {
      auto word = [&](const char* key, const char* a, const char* b) {
        if (!kwargs.contains(key)) return std::string(a);
        const nlohmann::json& v = kwargs[key];
        LT_CHECK_INPUT(v.is_string() && (v == a || v == b), "option lr_scheduler_kwargs: '", key,
                       "' must be ", a, " or ", b, ", got ", v.dump());
        return v.get<std::string>();
      };
      s.plateau_max = word("mode", "min", "max") == "max";
      s.plateau_rel = word("threshold_mode", "rel", "abs") == "rel";
      s.factor = number(kwargs, "factor", 0.1);
      LT_CHECK_INPUT(s.factor < 1.0 && s.factor >= 0,
                     "option lr_scheduler_kwargs: factor must be in [0, 1), got ", s.factor);
      s.patience = count(kwargs, "patience", 10);
      s.threshold = number(kwargs, "threshold", 1e-4);
      s.cooldown = count(kwargs, "cooldown", 0);
      s.min_lr = number(kwargs, "min_lr", 0.0);
      s.eps = number(kwargs, "eps", 1e-8);
      LT_CHECK_INPUT(s.min_lr >= 0 && s.eps >= 0,
                     "option lr_scheduler_kwargs: min_lr and eps must not be negative");
      s.warmup_steps = 0;  // transformers' get_reduce_on_plateau_schedule has none
      break;
    }
    default:
      break;
  }
  s.current_lr = base_lr;
  return s;
}

void LrScheduler::observe(double metric) {
  if (type != LrSchedule::kReduceLrOnPlateau) return;
  // torch.optim.lr_scheduler.ReduceLROnPlateau.step (NaN is never better).
  bool better;
  if (!plateau_best) {
    better = !std::isnan(metric);
  } else if (plateau_rel) {
    better = plateau_max ? metric > *plateau_best * (1.0 + threshold)
                         : metric < *plateau_best * (1.0 - threshold);
  } else {
    better = plateau_max ? metric > *plateau_best + threshold : metric < *plateau_best - threshold;
  }
  if (better) {
    plateau_best = metric;
    num_bad = 0;
  } else {
    ++num_bad;
  }
  if (cooldown_counter > 0) {
    --cooldown_counter;
    num_bad = 0;
  }
  if (num_bad > patience) {
    const double reduced = std::max(current_lr * factor, min_lr);
    if (current_lr - reduced > eps) current_lr = reduced;
    cooldown_counter = cooldown;
    num_bad = 0;
  }
}

nlohmann::json LrScheduler::state() const {
  if (type != LrSchedule::kReduceLrOnPlateau) return nullptr;
  return {{"lr", current_lr},
          {"best", plateau_best ? nlohmann::json(*plateau_best) : nlohmann::json(nullptr)},
          {"num_bad", num_bad},
          {"cooldown_counter", cooldown_counter}};
}

void LrScheduler::set_state(const nlohmann::json& s, const std::string& source) {
  if (type != LrSchedule::kReduceLrOnPlateau) return;
  if (s.is_null()) return;  // a checkpoint of another schedule: the plateau starts afresh
  auto count_of = [&](const char* key) {
    LT_CHECK_INPUT(s.contains(key) && s[key].is_number_integer() && s[key].get<int64_t>() >= 0,
                   source, ": lr_scheduler key '", key, "' must be a non-negative integer");
    return s[key].get<int64_t>();
  };
  LT_CHECK_INPUT(s.is_object() && s.contains("lr") && s["lr"].is_number() && s.contains("best") &&
                     (s["best"].is_null() || s["best"].is_number()),
                 source, ": lr_scheduler must be {lr, best, num_bad, cooldown_counter}, got ",
                 s.dump());
  current_lr = s["lr"].get<double>();
  plateau_best.reset();
  if (s["best"].is_number()) plateau_best = s["best"].get<double>();
  num_bad = count_of("num_bad");
  cooldown_counter = count_of("cooldown_counter");
}

double LrScheduler::lr(int64_t k) const {
  const double w = static_cast<double>(warmup_steps), n = static_cast<double>(total_steps);
  const double kk = static_cast<double>(k);
  if (type == LrSchedule::kConstant) return base_lr;
  if (type == LrSchedule::kReduceLrOnPlateau) return current_lr;
  if (type == LrSchedule::kWarmupStableDecay) {
    double f;
    if (k < warmup_steps) {
      f = wsd_curve(warmup_type, kk / std::max(1.0, w), num_cycles, true);
      f = std::max(0.0, f * (1.0 - min_lr_ratio) + min_lr_ratio);
    } else if (k < warmup_steps + num_stable_steps) {
      f = 1.0;
    } else if (k < warmup_steps + num_stable_steps + num_decay_steps) {
      const double x = (kk - w - static_cast<double>(num_stable_steps)) /
                       std::max(1.0, static_cast<double>(num_decay_steps));
      f = wsd_curve(decay_type, x, num_cycles, false);
      f = std::max(0.0, f * (1.0 - min_lr_ratio) + min_lr_ratio);
    } else {
      f = min_lr_ratio;
    }
    return base_lr * f;
  }
  if (k < warmup_steps) return base_lr * kk / std::max(1.0, w);
  const double p = (kk - w) / std::max(1.0, n - w);
  switch (type) {
    case LrSchedule::kLinear:
      return base_lr * std::max(0.0, (n - kk) / std::max(1.0, n - w));
    case LrSchedule::kCosine:
      return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * p)));
    case LrSchedule::kCosineWithRestarts:
      if (p >= 1.0) return 0.0;
      return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(num_cycles * p, 1.0))));
    case LrSchedule::kCosineWithMinLr: {
      const double f = 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * p));
      return base_lr * std::max(0.0, f * (1.0 - min_lr_rate) + min_lr_rate);
    }
    case LrSchedule::kPolynomial: {
      const double decay_steps = n - w;
      if (k > total_steps || decay_steps <= 0) return lr_end;
      const double remaining = 1.0 - (kk - w) / decay_steps;
      return (base_lr - lr_end) * std::pow(remaining, power) + lr_end;
    }
    case LrSchedule::kInverseSqrt:
      return base_lr / std::sqrt((kk + timescale - w) / timescale);
    case LrSchedule::kConstantWithWarmup:
      return base_lr;
    case LrSchedule::kConstant:
    case LrSchedule::kReduceLrOnPlateau:
    case LrSchedule::kWarmupStableDecay:
      break;
  }
  return base_lr;
}

}  // namespace leantune
