// Length statistics, candidate tables, efficiencies and histograms (see length_stats.h).
#include "loaders/length_stats.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

#include "engine/check.h"
#include "loaders/data_loader.h"
#include "loaders/pack.h"

namespace leantune {

int64_t percentile_of_sorted(std::span<const int64_t> sorted, double q) {
  if (sorted.empty()) return 0;
  const double n = static_cast<double>(sorted.size());
  int64_t rank = static_cast<int64_t>(std::ceil(q / 100.0 * n - 1e-9));
  rank = std::clamp<int64_t>(rank, 1, static_cast<int64_t>(sorted.size()));
  return sorted[static_cast<size_t>(rank - 1)];
}

LengthSummary summarize_lengths(std::span<const int64_t> lengths) {
  LengthSummary s;
  if (lengths.empty()) return s;
  std::vector<int64_t> sorted(lengths.begin(), lengths.end());
  std::sort(sorted.begin(), sorted.end());
  s.count = static_cast<int64_t>(sorted.size());
  for (int64_t l : sorted) s.total += l;
  s.min = sorted.front();
  s.max = sorted.back();
  s.mean = static_cast<double>(s.total) / static_cast<double>(s.count);
  s.p50 = percentile_of_sorted(sorted, 50);
  s.p90 = percentile_of_sorted(sorted, 90);
  s.p95 = percentile_of_sorted(sorted, 95);
  s.p99 = percentile_of_sorted(sorted, 99);
  return s;
}

namespace {

CandidateRow kept_at(std::span<const int64_t> lengths, int64_t max_length, std::string label) {
  CandidateRow r;
  r.max_length = max_length;
  r.label = std::move(label);
  int64_t whole = 0, kept = 0, total = 0;
  for (int64_t l : lengths) {
    whole += l <= max_length;
    kept += std::min(l, max_length);
    total += l;
  }
  r.examples_kept = lengths.empty() ? 0 : static_cast<double>(whole) / lengths.size();
  r.tokens_kept = total > 0 ? static_cast<double>(kept) / static_cast<double>(total) : 0;
  return r;
}

}  // namespace

std::vector<CandidateRow> candidate_table(std::span<const int64_t> lengths) {
  const LengthSummary s = summarize_lengths(lengths);
  std::vector<std::pair<int64_t, std::string>> points;
  for (int64_t p = 128;; p *= 2) {
    points.push_back({p, ""});
    if (p >= s.max) break;
  }
  const std::pair<int64_t, const char*> pct[] = {
      {s.p50, "p50"}, {s.p90, "p90"}, {s.p95, "p95"}, {s.p99, "p99"}, {s.max, "max"}};
  for (const auto& [v, name] : pct) {
    if (v <= 0) continue;
    auto it =
        std::find_if(points.begin(), points.end(), [&](const auto& p) { return p.first == v; });
    if (it == points.end()) {
      points.push_back({v, name});
    } else {
      it->second = it->second.empty() ? name : it->second + "," + name;
    }
  }
  std::sort(points.begin(), points.end());
  std::vector<CandidateRow> out;
  for (const auto& [v, label] : points) out.push_back(kept_at(lengths, v, label));
  return out;
}

int64_t recommend_max_length(std::span<const int64_t> lengths) {
  if (lengths.empty()) return 0;
  const LengthSummary s = summarize_lengths(lengths);
  int64_t best = s.max;
  for (const CandidateRow& r : candidate_table(lengths)) {
    if (r.examples_kept >= 0.99) {
      best = r.max_length;
      break;
    }
  }
  return (best + 63) / 64 * 64;
}

std::vector<StrategyEfficiency> strategy_efficiencies(std::span<const int64_t> lengths,
                                                      int64_t max_length, int64_t batch_size,
                                                      uint64_t seed) {
  LT_CHECK_INPUT(max_length >= 1, "max_length must be >= 1, got ", max_length);
  LT_CHECK_INPUT(batch_size >= 1, "per_device_train_batch_size must be >= 1, got ", batch_size);
  std::vector<StrategyEfficiency> out;
  int64_t total = 0, truncated = 0;
  for (int64_t l : lengths) {
    total += l;
    truncated += std::min(l, max_length);
  }
  const double kept = total > 0 ? static_cast<double>(truncated) / static_cast<double>(total) : 0;
  const int64_t n = static_cast<int64_t>(lengths.size());

  // Padded: shuffled micro-batches, each as wide as its longest (truncated) row.
  const EpochSampler sampler(n, batch_size, seed, true);
  const std::vector<int64_t> order = sampler.order(0);
  int64_t processed = 0;
  for (int64_t b = 0; b < n; b += batch_size) {
    int64_t longest = 0;
    const int64_t end = std::min(n, b + batch_size);
    for (int64_t i = b; i < end; ++i) {
      longest = std::max(
          longest,
          std::min(lengths[static_cast<size_t>(order[static_cast<size_t>(i)])], max_length));
    }
    processed += longest * (end - b);
  }
  const int64_t batches = (n + batch_size - 1) / batch_size;
  out.push_back(
      {"padded", processed > 0 ? static_cast<double>(truncated) / processed : 0, kept, batches});
  out.push_back({"padding_free", truncated > 0 ? 1.0 : 0.0, kept, batches});
  for (PackingStrategy s :
       {PackingStrategy::kBfd, PackingStrategy::kBfdSplit, PackingStrategy::kWrapped}) {
    const Packing p = pack_lengths(lengths, max_length, s);
    out.push_back({packing_strategy_name(s), p.efficiency(),
                   total > 0 ? static_cast<double>(p.real_tokens) / static_cast<double>(total) : 0,
                   p.num_bins()});
  }
  return out;
}

std::string text_histogram(std::span<const int64_t> lengths, int bar_width) {
  if (lengths.empty()) return "";
  int64_t max_len = 0;
  for (int64_t l : lengths) max_len = std::max(max_len, l);
  // Bucket k holds [2^k, 2^(k+1)); bucket "0" holds empty sequences.
  const int top = max_len > 0 ? 64 - std::countl_zero(static_cast<uint64_t>(max_len)) : 1;
  std::vector<int64_t> counts(static_cast<size_t>(top) + 1, 0);
  for (int64_t l : lengths) {
    const int k = l > 0 ? 64 - std::countl_zero(static_cast<uint64_t>(l)) : 0;
    ++counts[static_cast<size_t>(k)];
  }
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  size_t first = 0;
  while (first + 1 < counts.size() && counts[first] == 0) ++first;
  std::string out;
  char buf[128];
  for (size_t k = first; k < counts.size(); ++k) {
    if (k == 0) {
      std::snprintf(buf, sizeof(buf), "  %-17s %9lld |", "0", static_cast<long long>(counts[k]));
    } else {
      const long long lo = 1ll << (k - 1), hi = 1ll << k;
      char range[48];
      std::snprintf(range, sizeof(range), "[%lld, %lld)", lo, hi);
      std::snprintf(buf, sizeof(buf), "  %-17s %9lld |", range, static_cast<long long>(counts[k]));
    }
    out += buf;
    const int bar = most > 0 ? static_cast<int>(std::llround(static_cast<double>(counts[k]) *
                                                             bar_width / static_cast<double>(most)))
                             : 0;
    out += std::string(static_cast<size_t>(counts[k] > 0 ? std::max(bar, 1) : 0), '#');
    out += '\n';
  }
  return out;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

int64_t nice_tick_step(int64_t span, int max_ticks) {
  const int64_t need =
      std::max<int64_t>(1, (std::max<int64_t>(span, 1) + max_ticks - 1) / max_ticks);
  for (int64_t mag = 1;; mag *= 10)
    for (int64_t m : {1, 2, 5})
      if (m * mag >= need) return m * mag;
}

std::vector<SvgLabel> place_labels(std::vector<SvgLabel> labels, double x_min, double x_max) {
  constexpr double kGap = 6;
  for (size_t i = 0; i < labels.size(); ++i) {
    SvgLabel& l = labels[i];
    const double w = kSvgCharWidth * static_cast<double>(l.text.size());
    l.end_anchor = l.x + 4 + w > x_max && l.x - 4 - w >= x_min;
    l.x0 = l.end_anchor ? l.x - 4 - w : std::max(x_min, l.x + 4);
    l.x1 = l.x0 + w;
    for (l.row = 0;; ++l.row) {
      bool free = true;
      for (size_t j = 0; j < i; ++j)
        free = free && (labels[j].row != l.row || l.x1 + kGap <= labels[j].x0 ||
                        labels[j].x1 + kGap <= l.x0);
      if (free) break;
    }
  }
  return labels;
}

std::string svg_histogram(std::span<const int64_t> lengths, const std::string& title,
                          int64_t recommended) {
  const LengthSummary s = summarize_lengths(lengths);
  const std::pair<int64_t, const char*> marks[] = {
      {s.p50, "p50"}, {s.p90, "p90"}, {s.p99, "p99"}, {recommended, "max_length"}};
  int label_rows = 1;
  const int width = 900, right = 30, left = 70, bottom = 60;
  // The x axis ends on a round tick at or after the longest example and the recommendation.
  const int64_t x_step = nice_tick_step(std::max(s.max, recommended), 8);
  const int64_t span =
      (std::max<int64_t>(std::max(s.max, recommended), 1) + x_step - 1) / x_step * x_step;
  const int plot_w = width - left - right;
  auto x_of = [&](double len) { return left + plot_w * len / static_cast<double>(span); };
  std::vector<SvgLabel> labels;
  for (const auto& [v, name] : marks)
    if (v > 0)
      labels.push_back({x_of(static_cast<double>(v)), std::string(name) + " " + std::to_string(v),
                        std::string(name) == "max_length"});
  labels = place_labels(std::move(labels), 0, width - 4);
  for (const SvgLabel& l : labels) label_rows = std::max(label_rows, l.row + 1);
  // The marker labels sit in rows above the plot, so they never cover a bar.
  const int top = 40 + 14 * label_rows, height = top + 310 + bottom;
  const int plot_h = height - top - bottom;

  const int nb = static_cast<int>(std::min<int64_t>(60, span));
  const double bucket = static_cast<double>(span) / nb;
  std::vector<int64_t> counts(static_cast<size_t>(nb), 0);
  for (int64_t l : lengths) {
    int k = static_cast<int>(static_cast<double>(l) / bucket);
    ++counts[static_cast<size_t>(std::clamp(k, 0, nb - 1))];
  }
  const int64_t most_count = std::max<int64_t>(1, *std::max_element(counts.begin(), counts.end()));
  const int64_t y_step = nice_tick_step(most_count, 5);
  const int64_t most = (most_count + y_step - 1) / y_step * y_step;
  auto y_of = [&](double c) { return top + plot_h * (1.0 - c / static_cast<double>(most)); };

  std::string o;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
                width, height, width, height);
  o += buf;
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(buf, sizeof(buf),
                "<text x=\"%d\" y=\"22\" font-size=\"15\">%s (%lld examples, %lld tokens)</text>\n",
                left, xml_escape(title).c_str(), static_cast<long long>(s.count),
                static_cast<long long>(s.total));
  o += buf;
  for (int k = 0; k < nb; ++k) {
    const double x0 = x_of(k * bucket), x1 = x_of((k + 1) * bucket);
    const double y = y_of(static_cast<double>(counts[static_cast<size_t>(k)]));
    std::snprintf(buf, sizeof(buf),
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#4878a8\">"
                  "<title>[%lld, %lld): %lld</title></rect>\n",
                  x0, y, std::max(0.5, x1 - x0 - 1), top + plot_h - y,
                  static_cast<long long>(std::llround(k * bucket)),
                  static_cast<long long>(std::llround((k + 1) * bucket)),
                  static_cast<long long>(counts[static_cast<size_t>(k)]));
    o += buf;
  }
  std::snprintf(buf, sizeof(buf),
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
                left, top + plot_h, left + plot_w, top + plot_h, left, top, left, top + plot_h);
  o += buf;
  // Round ticks: multiples of 1, 2 or 5 x 10^k.
  for (int64_t v = 0; v <= span; v += x_step) {
    std::snprintf(buf, sizeof(buf),
                  "<text class=\"tick-x\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%lld</text>\n",
                  x_of(static_cast<double>(v)), top + plot_h + 18, static_cast<long long>(v));
    o += buf;
  }
  for (int64_t c = 0; c <= most; c += y_step) {
    std::snprintf(buf, sizeof(buf),
                  "<text class=\"tick-y\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%lld</text>\n",
                  left - 6, y_of(static_cast<double>(c)) + 4, static_cast<long long>(c));
    o += buf;
  }
  std::snprintf(buf, sizeof(buf),
                "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">tokens per example</text>\n"
                "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" "
                "text-anchor=\"middle\">examples</text>\n",
                left + plot_w / 2, height - 15, top + plot_h / 2, top + plot_h / 2);
  o += buf;
  // The marker lines first, then their labels with a white halo: a line never hides a label.
  for (const SvgLabel& l : labels) {
    std::snprintf(buf, sizeof(buf),
                  "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" "
                  "stroke-dasharray=\"%s\"/>\n",
                  l.x, 32 + 14 * l.row, l.x, top + plot_h, l.accent ? "#c03030" : "#606060",
                  l.accent ? "6,3" : "2,3");
    o += buf;
  }
  for (const SvgLabel& l : labels) {
    std::snprintf(buf, sizeof(buf),
                  "<text class=\"mark\" x=\"%.1f\" y=\"%d\" fill=\"%s\" text-anchor=\"%s\" "
                  "stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">%s</text>\n",
                  l.end_anchor ? l.x - 4 : l.x0, 42 + 14 * l.row, l.accent ? "#c03030" : "#404040",
                  l.end_anchor ? "end" : "start", l.text.c_str());
    o += buf;
  }
  o += "</svg>\n";
  return o;
}

}  // namespace leantune
