// trainer_bin memviz TRACE.json -o trace.html: turns an allocator trace (--memory_trace) into
// one self-contained HTML page (cli/memviz_page.cpp) and prints the peak on stdout.
// A malformed trace is exit 2 with one line naming the file and the event. The page never
// replaces the trace (output_path.h) and is written to a temporary file renamed on success.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/memviz.h"
#include "engine/allocator.h"
#include "engine/check.h"
#include "loaders/fs_util.h"
#include "trainers/common/output_path.h"

namespace leantune {
namespace {

int run_memviz(const std::vector<std::string>& args) {
  CLI::App app{"Draws an allocator trace (--memory_trace) as one self-contained HTML page.",
               "trainer_bin memviz"};
  std::string trace_path, out = "trace.html";
  int64_t max_points = 4000;
  app.add_option("trace", trace_path, "the trace JSON written by --memory_trace")->required();
  app.add_option("-o,--output", out, "the HTML file to write");
  app.add_option("--max_points", max_points, "timeline points kept (the peak always is)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  if (!parse_tool_args(app, args, "memviz")) return 0;
  check_output_file(out, "output", {{trace_path, "TRACE"}});
  const nlohmann::json a = analyse_memory_trace_file(trace_path, max_points);
  write_text_atomic(out, memory_trace_html(a));
  const nlohmann::json& pk = a["peak"];
  std::printf("memviz: %s: %lld events, peak allocated %s (%s), reserved %s; wrote %s\n",
              trace_path.c_str(), static_cast<long long>(a["events"].get<int64_t>()),
              format_bytes(pk["allocated"].get<int64_t>()).c_str(),
              pk["phase"].get<std::string>().c_str(),
              format_bytes(pk["reserved"].get<int64_t>()).c_str(), out.c_str());
  return 0;
}

}  // namespace

int cmd_memviz(const std::vector<std::string>& args) { return run_memviz(args); }

}  // namespace leantune
