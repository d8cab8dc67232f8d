// trainer_bin plot OUTPUT_DIR: the curves of a run's metrics.jsonl as one self-contained HTML
// page of inline SVG charts (no script, nothing fetched), one chart per quantity against the
// update step:
//   loss           loss and eval_loss
//   learning rate, grad norm, tokens/s (with MFU on its own chart when logged)
//   memory         memory.by_tag.<tag>.current per tag (tags at 0 throughout left out) and
//                  memory.peak_allocated, in GiB
//   <group>        every other metric named group/... (DPO/KTO rewards/*, logps/*, GRPO's
//                  completions/*, objective/*, ...): one chart per group, the training series
//                  solid and the eval_ ones dashed
//   <name>         any other number (entropy, mean_token_accuracy, kl, padding_efficiency...)
// Left out: step, epoch, num_tokens, total_steps and eval_runtime/throughput. Each point has a
// <title> (the browser's tooltip: series, step, value); a chart's y axis has round ticks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace leantune {

struct PlotSeries {
  std::string name;  // as in the legend: "loss", "eval_loss", "param"
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // (step, value), in file order
};
struct PlotChart {
  std::string title;  // "loss", "memory (GiB)", "rewards", ...
  std::vector<PlotSeries> series;
};

// The charts of metrics.jsonl's records (objects, in file order), in the order listed above.
std::vector<PlotChart> metrics_charts(const std::vector<nlohmann::json>& records);
// The page: `title` as its heading, then every chart.
std::string metrics_page(const std::vector<PlotChart>& charts, const std::string& title);
// metrics.jsonl's records: throws Error kInput naming the file and line of a malformed one,
// except a torn last line without its newline (a run killed while writing), which is left out
// and reported through *torn_last when given.
std::vector<nlohmann::json> read_metrics_file(const std::string& path, bool* torn_last = nullptr);

}  // namespace leantune
