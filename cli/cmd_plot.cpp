// trainer_bin plot OUTPUT_DIR [-o curves.html]: a run's metrics.jsonl drawn as one
// self-contained HTML page of charts (cli/plot.h), written whole or not at all, never over the
// metrics file. OUTPUT_DIR may also be the metrics.jsonl itself. Prints what it drew.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/plot.h"
#include "engine/check.h"
#include "loaders/fs_util.h"
#include "trainers/common/output_path.h"

namespace leantune {

int cmd_plot(const std::vector<std::string>& args) {
  CLI::App app{"Draws a run's metrics.jsonl as one self-contained HTML page of charts.",
               "trainer_bin plot"};
  std::string run, out;
  app.add_option("output_dir", run, "the run's output_dir (or its metrics.jsonl)")->required();
  app.add_option("-o,--output", out, "the HTML file to write (default: OUTPUT_DIR/curves.html)");
  if (!parse_tool_args(app, args, "plot")) return 0;
  namespace fs = std::filesystem;
  const bool is_dir = fs::is_directory(run);
  const std::string metrics = is_dir ? run + "/metrics.jsonl" : run;
  LT_CHECK_INPUT(fs::exists(metrics), "plot: ", metrics, " does not exist",
                 is_dir ? " (is this a run's output_dir?)" : "");
  if (out.empty()) out = (is_dir ? run : fs::path(run).parent_path().string()) + "/curves.html";
  check_output_file(out, "output", {{metrics, "OUTPUT_DIR"}});
  bool torn = false;
  const std::vector<nlohmann::json> records = read_metrics_file(metrics, &torn);
  const std::vector<PlotChart> charts = metrics_charts(records);
  write_text_atomic(out, metrics_page(charts, metrics));
  std::string names;
  for (const PlotChart& c : charts) names += (names.empty() ? "" : ", ") + c.title;
  std::printf("plot: %s: %zu records%s, %zu charts (%s); wrote %s\n", metrics.c_str(),
              records.size(), torn ? " (a torn last line left out)" : "", charts.size(),
              names.c_str(), out.c_str());
  return 0;
}

}  // namespace leantune
