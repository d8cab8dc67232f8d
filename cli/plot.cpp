// The charts of trainer_bin plot (see plot.h).
#include "cli/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "engine/check.h"
#include "loaders/length_stats.h"

namespace leantune {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
const char* const kColors[] = {"#4878a8", "#c05030", "#50a050", "#8860b0",
                               "#c0a020", "#30a0a0", "#a04880", "#707070"};

bool left_out(const std::string& k) {
  static const std::set<std::string> skip = {"step",
                                             "epoch",
                                             "num_tokens",
                                             "total_steps",
                                             "eval_runtime",
                                             "eval_samples_per_second",
                                             "eval_steps_per_second",
                                             "total_flos",
                                             "train_runtime",
                                             "train_samples_per_second",
                                             "train_steps_per_second",
                                             "memory"};
  return skip.count(k) > 0;
}

// Charts in the order of plot.h, each series in first-seen order.
class ChartSet {
 public:
  void add(const std::string& chart, const std::string& series, bool dashed, double step,
           double v) {
    if (!std::isfinite(v)) return;
    auto [it, fresh] = index_.try_emplace(chart, charts_.size());
    if (fresh) charts_.push_back({chart, {}});
    PlotChart& c = charts_[it->second];
    auto s = std::find_if(c.series.begin(), c.series.end(),
                          [&](const PlotSeries& p) { return p.name == series; });
    if (s == c.series.end()) {
      c.series.push_back({series, dashed, {}});
      s = c.series.end() - 1;
    }
    s->points.push_back({step, v});
  }
  std::vector<PlotChart> take(const std::vector<std::string>& first) {
    std::vector<PlotChart> out;
    for (const std::string& t : first)
      if (auto it = index_.find(t); it != index_.end()) out.push_back(charts_[it->second]);
    for (const PlotChart& c : charts_)
      if (std::find(first.begin(), first.end(), c.title) == first.end()) out.push_back(c);
    return out;
  }

 private:
  std::vector<PlotChart> charts_;
  std::map<std::string, size_t> index_;
};

// The smallest 1, 2 or 5 x 10^k step giving at most max_ticks intervals over span > 0.
double nice_step(double span, int max_ticks) {
  const double raw = span / max_ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw * (1 - 1e-12)) return m * mag;
  return 10 * mag;
}

std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", std::abs(v) < 1e-12 ? 0.0 : v);
  return b;
}

std::string chart_svg(const PlotChart& c) {
  const int width = 560, left = 64, right = 16, bottom = 40, ph = 220;
  const int pw = width - left - right;
  // The legend in rows under the title, wrapped at the right edge: each entry's x and row.
  std::vector<std::pair<double, int>> legend;
  double lx = left;
  int rows = 1;
  for (const PlotSeries& s : c.series) {
    const double w = 20 + 6.5 * static_cast<double>(s.name.size());
    if (lx > left && lx + w > width - right) {
      lx = left;
      ++rows;
    }
    legend.push_back({lx, rows - 1});
    lx += w + 14;
  }
  const int top = 30 + 15 * rows, height = top + ph + bottom;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const PlotSeries& s : c.series)
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) {
    const double pad = y0 == 0 ? 1 : std::abs(y0) * 0.1;
    y0 -= pad, y1 += pad;
  }
  const double ys = nice_step(y1 - y0, 5);
  y0 = std::floor(y0 / ys) * ys, y1 = std::ceil(y1 / ys) * ys;
  const double xs = std::max(1.0, nice_step(x1 - x0, 6));
  x0 = std::floor(x0 / xs) * xs, x1 = std::ceil(x1 / xs) * xs;
  auto px = [&](double x) { return left + pw * (x - x0) / (x1 - x0); };
  auto py = [&](double y) { return top + ph * (1 - (y - y0) / (y1 - y0)); };

  std::string o;
  char b[640];
  std::snprintf(b, sizeof b,
                "<svg class=\"chart\" data-chart=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" "
                "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
                "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                "<text x=\"%d\" y=\"16\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
                xml_escape(c.title).c_str(), width, height, width, height, left,
                xml_escape(c.title).c_str());
  o += b;
  for (double y = y0; y <= y1 + ys * 1e-9; y += ys) {
    std::snprintf(b, sizeof b,
                  "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                  "<text class=\"tick-y\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                  left, py(y), left + pw, py(y), left - 5, py(y) + 4, number(y).c_str());
    o += b;
  }
  for (double x = x0; x <= x1 + xs * 1e-9; x += xs) {
    std::snprintf(b, sizeof b,
                  "<text class=\"tick-x\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                  px(x), top + ph + 15, number(x).c_str());
    o += b;
  }
  std::snprintf(b, sizeof b,
                "<polyline points=\"%d,%d %d,%d %d,%d\" fill=\"none\" stroke=\"black\"/>\n"
                "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
                left, top, left, top + ph, left + pw, top + ph, left + pw / 2, height - 6);
  o += b;
  // Each series: its legend entry in its colour, its line and its points.
  for (size_t k = 0; k < c.series.size(); ++k) {
    const PlotSeries& s = c.series[k];
    const char* color = kColors[k % std::size(kColors)];
    const double ex = legend[k].first;
    const int ey = 34 + 15 * legend[k].second;
    std::snprintf(b, sizeof b,
                  "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" "
                  "stroke-width=\"2\"%s/><text class=\"legend\" x=\"%.1f\" y=\"%d\">%s</text>\n",
                  ex, ey - 4, ex + 16, ey - 4, color, s.dashed ? " stroke-dasharray=\"4,3\"" : "",
                  ex + 20, ey, xml_escape(s.name).c_str());
    o += b;
    std::string pts;
    for (const auto& [x, y] : s.points) {
      std::snprintf(b, sizeof b, "%.1f,%.1f ", px(x), py(y));
      pts += b;
    }
    std::snprintf(b, sizeof b,
                  "<polyline class=\"series\" data-series=\"%s\" points=\"%s\" fill=\"none\" "
                  "stroke=\"%s\" stroke-width=\"1.6\"%s/>\n",
                  xml_escape(s.name).c_str(), pts.c_str(), color,
                  s.dashed ? " stroke-dasharray=\"4,3\"" : "");
    o += b;
    for (const auto& [x, y] : s.points) {
      std::snprintf(b, sizeof b,
                    "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\"><title>%s, step %s: "
                    "%s</title></circle>\n",
                    px(x), py(y), s.points.size() > 60 ? "1.5" : "2.5", color,
                    xml_escape(s.name).c_str(), number(x).c_str(), number(y).c_str());
      o += b;
    }
  }
  o += "</svg>\n";
  return o;
}

}  // namespace

std::vector<PlotChart> metrics_charts(const std::vector<nlohmann::json>& records) {
  ChartSet set;
  for (const nlohmann::json& r : records) {
    if (!r.is_object() || !r.contains("step") || !r["step"].is_number()) continue;
    const double step = r["step"].get<double>();
    for (const auto& [k, v] : r.items()) {
      if (k == "memory" && v.is_object()) {
        if (v.contains("by_tag") && v["by_tag"].is_object())
          for (const auto& [tag, m] : v["by_tag"].items())
            if (m.is_object() && m.contains("current") && m["current"].is_number())
              set.add("memory (GiB)", tag, false, step, m["current"].get<double>() / kGiB);
        if (v.contains("peak_allocated") && v["peak_allocated"].is_number())
          set.add("memory (GiB)", "peak_allocated", true, step,
                  v["peak_allocated"].get<double>() / kGiB);
        continue;
      }
      if (!v.is_number() || left_out(k)) continue;
      const bool eval = k.rfind("eval_", 0) == 0;
      const std::string name = eval ? k.substr(5) : k;
      std::string chart = name;
      if (name == "tokens_per_second") chart = "tokens/s";
      const size_t slash = name.find('/');
      if (slash != std::string::npos) chart = name.substr(0, slash);
      set.add(chart, k, eval, step, v.get<double>());
    }
  }
  std::vector<PlotChart> charts =
      set.take({"loss", "learning_rate", "grad_norm", "tokens/s", "mfu", "memory (GiB)"});
  // A tag that held nothing at any logged step (no KV cache in sft, say) is left off its chart.
  for (PlotChart& c : charts)
    if (c.title == "memory (GiB)")
      std::erase_if(c.series, [](const PlotSeries& s) {
        return std::all_of(s.points.begin(), s.points.end(),
                           [](const auto& p) { return p.second == 0; });
      });
  return charts;
}

std::string metrics_page(const std::vector<PlotChart>& charts, const std::string& title) {
  std::string o = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" +
                  xml_escape(title) +
                  "</title>\n<style>body{font-family:sans-serif;margin:16px;background:#f6f6f6}"
                  "h1{font-size:18px}.charts{display:flex;flex-wrap:wrap;gap:12px}"
                  "svg.chart{background:white;border:1px solid #ddd}</style></head>\n<body>\n<h1>" +
                  xml_escape(title) + "</h1>\n";
  if (charts.empty()) o += "<p class=\"empty\">no logged metrics</p>\n";
  o += "<div class=\"charts\">\n";
  for (const PlotChart& c : charts) o += chart_svg(c);
  o += "</div>\n</body></html>\n";
  return o;
}

std::vector<nlohmann::json> read_metrics_file(const std::string& path, bool* torn_last) {
  std::ifstream in(path, std::ios::binary);
  LT_CHECK_INPUT(in.good(), path,
                 ": cannot read (trainer_bin plot wants a run's output_dir or "
                 "its metrics.jsonl)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (torn_last) *torn_last = false;
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  for (int64_t n = 1; pos < text.size(); ++n) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string line = text.substr(pos, end - pos);
    const bool last_unterminated = end == text.size();
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      // A run killed while writing leaves its last record torn: left out and said.
      if (last_unterminated && torn_last) {
        *torn_last = true;
        break;
      }
      LT_THROW(ErrorKind::kInput, path, ":", n, ": not a JSON record (", e.what(), ")");
    }
    LT_CHECK_INPUT(out.back().is_object(), path, ":", n, ": a record must be a JSON object");
  }
  return out;
}

}  // namespace leantune
