// Evaluation options, schedule, best-metric tracking and the evaluation line (evaluation.h).
#include "trainers/common/evaluation.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "engine/check.h"

namespace leantune {

const OptionTable<EvalArguments>& eval_table() {
  using A = EvalArguments;
  static const OptionTable<A> t =
      OptionTable<A>()
          .integer("per_device_eval_batch_size", &A::per_device_eval_batch_size,
                   "examples per evaluation batch", 1)
          .text("eval_strategy", &A::eval_strategy,
                "when the evaluation data is evaluated during training: never (no; a run with "
                "eval_dataset still evaluates once at the end), every eval_steps updates (steps; "
                "implied by --eval_steps alone) or after every epoch (epoch)",
                {"no", "steps", "epoch"})
          .real("eval_steps", &A::eval_steps,
                "evaluate every this many updates under eval_strategy steps (below 1: a ratio of "
                "all updates; 0 = logging_steps)",
                0.0)
          .flag("eval_on_start", &A::eval_on_start, "evaluate once before the first update")
          .flag("load_best_model_at_end", &A::load_best_model_at_end,
                "write the weights of the checkpoint with the best metric_for_best_model as the "
                "final model (save_strategy must equal eval_strategy)")
          .text("metric_for_best_model", &A::metric_for_best_model,
                "the evaluation metric whose best value is tracked (trainer_state.json's "
                "best_metric), e.g. loss or rewards/accuracies; eval_ is prefixed")
          .flag_or_none("greater_is_better", &A::greater_is_better,
                        "whether a larger metric_for_best_model is better (none: false for a "
                        "metric ending in loss, else true)");
  return t;
}

int64_t resolve_steps(double steps, int64_t total_steps) {
  if (steps >= 1) return static_cast<int64_t>(steps);
  return static_cast<int64_t>(std::ceil(steps * static_cast<double>(total_steps)));
}

void check_steps(const char* option, double steps) {
  LT_CHECK_INPUT(steps >= 0 && std::isfinite(steps) && (steps < 1 || steps == std::floor(steps)),
                 "option --", option, " ", steps,
                 ": a number of updates (an integer from 1) or a ratio of all updates (below 1)");
}

EvalArguments eval_arguments(const Options& o, const std::string& save_strategy, double save_steps,
                             double logging_steps) {
  EvalArguments a = eval_table().read(o);
  check_steps("eval_steps", a.eval_steps);
  if (o.is_set("eval_steps") && !o.is_set("eval_strategy")) a.eval_strategy = "steps";
  LT_CHECK_INPUT(a.eval_strategy == "steps" || !o.is_set("eval_steps"), "option --eval_steps ",
                 a.eval_steps, " is for eval_strategy steps, not ", a.eval_strategy);
  if (a.eval_strategy == "steps" && a.eval_steps == 0) a.eval_steps = logging_steps;
  LT_CHECK_INPUT(!a.metric_for_best_model.empty() && a.metric_for_best_model != "eval_",
                 "option --metric_for_best_model must name a metric");
  if (a.load_best_model_at_end) {
    LT_CHECK_INPUT(a.eval_strategy != "no",
                   "option --load_best_model_at_end needs --eval_strategy steps or epoch");
    LT_CHECK_INPUT(save_strategy == a.eval_strategy,
                   "option --load_best_model_at_end: save_strategy (", save_strategy,
                   ") must equal eval_strategy (", a.eval_strategy,
                   "), so that every evaluation has a checkpoint to load");
    // transformers: both numbers of updates or both ratios, save_steps a multiple of eval_steps.
    const double k = save_steps / a.eval_steps;
    LT_CHECK_INPUT(
        a.eval_strategy != "steps" || ((save_steps < 1) == (a.eval_steps < 1) && save_steps > 0 &&
                                       k >= 1 && std::abs(k - std::round(k)) < 1e-9),
        "option --load_best_model_at_end: save_steps (", save_steps,
        ") must be a multiple of eval_steps (", a.eval_steps, "), both updates or both ratios");
  }
  return a;
}

std::string best_metric_key(const EvalArguments& a) {
  const std::string& m = a.metric_for_best_model;
  return m.rfind("eval_", 0) == 0 ? m : "eval_" + m;
}

bool greater_is_better(const EvalArguments& a) {
  if (a.greater_is_better) return *a.greater_is_better;
  const std::string& m = a.metric_for_best_model;
  return !(m.size() >= 4 && m.compare(m.size() - 4, 4, "loss") == 0);
}

bool eval_due(const EvalArguments& a, int64_t eval_every, int64_t step, int64_t updates_per_epoch) {
  if (a.eval_strategy == "steps") return eval_every > 0 && step % eval_every == 0;
  if (a.eval_strategy == "epoch") return updates_per_epoch > 0 && step % updates_per_epoch == 0;
  return false;
}

bool update_best(BestModel& best, const EvalArguments& a, const nlohmann::json& record,
                 int64_t step) {
  const std::string key = best_metric_key(a);
  if (!record.contains(key) || !record[key].is_number()) {
    std::string have;
    for (const auto& [k, v] : record.items())
      if (k.rfind("eval_", 0) == 0 && k != "eval_runtime" && v.is_number())
        have += (have.empty() ? "" : ", ") + k.substr(5);
    LT_THROW(ErrorKind::kInput, "option --metric_for_best_model ", a.metric_for_best_model,
             ": the evaluation logs no ", key, " (it logs: ", have, ")");
  }
  const double v = record[key].get<double>();
  if (!std::isfinite(v)) return false;
  const bool better = !best.metric || (greater_is_better(a) ? v > *best.metric : v < *best.metric);
  if (better) {
    best.metric = v;
    best.step = step;
    best.checkpoint.clear();
  }
  return better;
}

nlohmann::json best_to_json(const BestModel& best) {
  if (!best.metric) return nullptr;
  return {{"metric", *best.metric}, {"step", best.step}, {"checkpoint", best.checkpoint}};
}

BestModel best_from_json(const nlohmann::json& j, const std::string& source) {
  BestModel b;
  if (j.is_null()) return b;
  LT_CHECK_INPUT(j.is_object() && j.contains("metric") && j["metric"].is_number() &&
                     j.contains("step") && j["step"].is_number_integer() &&
                     j["step"].get<int64_t>() >= 0 && j.contains("checkpoint") &&
                     j["checkpoint"].is_string(),
                 source, ": key 'best' must be null or {metric, step, checkpoint}, got ", j.dump());
  b.metric = j["metric"].get<double>();
  b.step = j["step"].get<int64_t>();
  b.checkpoint = j["checkpoint"].get<std::string>();
  return b;
}

std::string format_eval_line(const nlohmann::json& record) {
  std::string s = "eval step " + std::to_string(record.value("step", int64_t{0}));
  char buf[64];
  auto add = [&](const std::string& name, const nlohmann::json& v) {
    std::snprintf(buf, sizeof buf, "%.4f", v.get<double>());
    s += " | " + name + " " + buf;
  };
  // The loss first, then the trainer's metrics in name order.
  if (record.contains("eval_loss") && record["eval_loss"].is_number())
    add("loss", record["eval_loss"]);
  for (const auto& [k, v] : record.items())
    if (k.rfind("eval_", 0) == 0 && k != "eval_loss" && k != "eval_runtime" && v.is_number())
      add(k.substr(5), v);
  if (record.contains("eval_runtime") && record["eval_runtime"].is_number()) {
    std::snprintf(buf, sizeof buf, " | %.1f s", record["eval_runtime"].get<double>());
    s += buf;
  }
  return s;
}

}  // namespace leantune
