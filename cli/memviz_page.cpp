// The HTML page of trainer_bin memviz: one self-contained file (inline script, SVG built as
// markup, no fonts, images or scripts fetched) that draws the analysis of memory_trace.cpp:
//   - allocated bytes stacked by tag over time, the peak marked (#peak-marker), a tag legend
//     (#legend) with each tag's bytes at the peak;
//   - the live blocks at the peak, largest first, with the phase that allocated them;
//   - reserved vs allocated over time (the gap is the cache's fragmentation and slack);
//   - each segment at the peak with its blocks placed at their offsets.
// The analysis is embedded as JSON in a <script type="application/json"> element; "</" is
// escaped so no string in it can close the element. body[data-rendered] becomes "ok" when
// every part drew, "error" on any script error (the browser test reads it).
#include <string>

#include "cli/memviz.h"

namespace leantune {

namespace {

constexpr const char* kHead = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>leantune memory trace</title>
<style>
body { font: 13px sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin-top: 28px; }
.legend-item { display: inline-block; margin-right: 14px; }
.swatch { display: inline-block; width: 11px; height: 11px; margin-right: 4px; vertical-align: -1px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; }
th { border-bottom: 1px solid #888; } td.l, th.l { text-align: left; }
.seg { margin: 3px 0; } .seg span { display: inline-block; width: 250px; }
svg text { font: 11px sans-serif; fill: #333; }
.summary td { text-align: left; padding: 1px 12px 1px 0; }
</style></head>
<body data-rendered="no">
<h1>leantune memory trace</h1>
<table class="summary" id="summary"></table>
<h2>Allocated bytes by tag over time</h2>
<div id="legend"></div>
<div id="timeline"></div>
<h2>Reserved vs allocated over time</h2>
<div id="fragmentation-chart"></div>
<h2>Segments at the peak</h2>
<p>Blocks allocated within the trace, placed at their offsets; grey is cached free space.</p>
<div id="segments"></div>
<h2>Live blocks at the peak, largest first</h2>
<table id="live-blocks"></table>
<script type="application/json" id="trace-data">)HTML";

constexpr const char* kTail = R"HTML(</script>
<script>
"use strict";
window.addEventListener("error", function () { document.body.dataset.rendered = "error"; });
(function () {
  const D = JSON.parse(document.getElementById("trace-data").textContent);
  const COLORS = {param: "#4e79a7", grad: "#f28e2b", optimizer: "#e15759", activation: "#76b7b2",
                  workspace: "#59a14f", kv_cache: "#edc948", comm: "#b07aa1", other: "#9c755f"};
  const esc = s => String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]);
  function fmt(b) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let v = b, i = 0;
    while (Math.abs(v) >= 1024 && i < 4) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(2)) + " " + u[i];
  }
  const ms = ns => (ns / 1e6).toFixed(2) + " ms";
  const tl = D.timeline, t0 = tl[0].t, t1 = Math.max(tl[tl.length - 1].t, t0 + 1);
  const W = 1100, H = 300, L = 80, R = 20, T = 14, B = 30;
  const X = t => L + (t - t0) / (t1 - t0) * (W - L - R);
  function axes(maxY, Y) {
    let s = "";
    for (let k = 0; k <= 4; k++) {
      const v = maxY * k / 4, y = Y(v);
      s += `<line x1="${L}" x2="${W - R}" y1="${y}" y2="${y}" stroke="#ddd"/>` +
           `<text x="${L - 6}" y="${y + 4}" text-anchor="end">${fmt(v)}</text>`;
    }
    for (let k = 0; k <= 5; k++) {
      const t = t0 + (t1 - t0) * k / 5;
      s += `<text x="${X(t)}" y="${H - 10}" text-anchor="middle">${ms(t - t0)}</text>`;
    }
    return s;
  }
  const pk = D.peak, baseTotal = D.baseline.by_tag.reduce((a, b) => a + b, 0);

  // Summary.
  const rows = [
    ["device", D.device], ["updates recorded", (D.steps || []).join(" to ") || "?"],
    ["events", D.events], ["peak allocated", fmt(pk.allocated) + " at " + ms(pk.t - t0) + " (" + pk.phase + ")"],
    ["reserved at the peak", fmt(pk.reserved)],
    ["fragmentation at the peak", fmt(pk.reserved - pk.allocated) + " (" +
      (pk.reserved > 0 ? (100 * (pk.reserved - pk.allocated) / pk.reserved).toFixed(1) : "0") + "% of reserved)"],
    ["allocated before the trace", fmt(baseTotal)], ["out-of-memory events", D.ooms]];
  document.getElementById("summary").innerHTML =
    rows.map(r => `<tr><td>${esc(r[0])}</td><td>${esc(r[1])}</td></tr>`).join("");

  // Stacked timeline with the peak marked.
  const maxA = Math.max(1, pk.allocated);
  const YA = v => T + (1 - Math.max(0, v) / maxA) * (H - T - B);
  let svg = `<svg width="${W}" height="${H}" id="timeline-svg">` + axes(maxA, YA);
  const cum = tl.map(() => 0);
  D.tags.forEach((tag, ti) => {
    const lo = cum.slice();
    tl.forEach((p, i) => { cum[i] += Math.max(0, p.tags[ti]); });
    if (tl.every((p, i) => cum[i] === lo[i])) return;
    let d = "M" + tl.map((p, i) => X(p.t).toFixed(1) + "," + YA(cum[i]).toFixed(1)).join("L");
    for (let i = tl.length - 1; i >= 0; i--) d += "L" + X(tl[i].t).toFixed(1) + "," + YA(lo[i]).toFixed(1);
    svg += `<path class="band" data-tag="${tag}" d="${d}Z" fill="${COLORS[tag]}" fill-opacity="0.85"/>`;
  });
  const px = X(pk.t);
  svg += `<g id="peak-marker"><line x1="${px}" x2="${px}" y1="${T}" y2="${H - B}" stroke="#d00" stroke-width="1.5" stroke-dasharray="4,3"/>` +
         `<text x="${px + 4}" y="${T + 10}" fill="#d00">peak ${esc(fmt(pk.allocated))} (${esc(pk.phase)})</text></g></svg>`;
  document.getElementById("timeline").innerHTML = svg;
  document.getElementById("legend").innerHTML = D.tags.map((tag, ti) =>
    `<span class="legend-item" data-tag="${tag}"><span class="swatch" style="background:${COLORS[tag]}"></span>` +
    `${tag}: ${fmt(pk.by_tag[ti])} at the peak</span>`).join("");

  // Reserved vs allocated.
  const maxR = Math.max(1, ...tl.map(p => p.reserved), pk.allocated);
  const YR = v => T + (1 - Math.max(0, v) / maxR) * (H - T - B);
  const total = p => p.tags.reduce((a, b) => a + Math.max(0, b), 0);
  const line = f => tl.map(p => X(p.t).toFixed(1) + "," + YR(f(p)).toFixed(1)).join(" ");
  document.getElementById("fragmentation-chart").innerHTML =
    `<svg width="${W}" height="${H}">` + axes(maxR, YR) +
    `<polyline fill="none" stroke="#333" stroke-width="1.5" points="${line(p => p.reserved)}"/>` +
    `<polyline fill="none" stroke="#4e79a7" stroke-width="1.5" points="${line(total)}"/>` +
    `<line x1="${px}" x2="${px}" y1="${T}" y2="${H - B}" stroke="#d00" stroke-dasharray="4,3"/>` +
    `<text x="${L + 8}" y="${T + 12}">black: reserved, blue: allocated; the gap is cached free memory</text></svg>`;

  // Segments at the peak.
  const SW = 760;
  document.getElementById("segments").innerHTML = D.segments_at_peak.map(s => {
    let r = "";
    s.blocks.forEach(b => {
      r += `<rect x="${(b.offset / s.size * SW).toFixed(1)}" width="${Math.max(1, b.size / s.size * SW).toFixed(1)}" ` +
           `height="14" fill="${COLORS[b.tag]}"><title>${esc(fmt(b.size) + " " + b.tag + ", " + b.phase)}</title></rect>`;
    });
    const free = s.size - s.allocated;
    return `<div class="seg"><span>segment ${s.id}: ${fmt(s.size)}, ${(100 * free / s.size).toFixed(0)}% free</span>` +
           `<svg width="${SW}" height="14"><rect width="${SW}" height="14" fill="#ddd"/>${r}</svg></div>`;
  }).join("") || "<p>No segment was created within the trace (all came from the cache).</p>";

  // Live blocks at the peak.
  const lb = D.live_at_peak, shown = lb.slice(0, 200);
  document.getElementById("live-blocks").innerHTML =
    `<tr><th>size</th><th class="l">tag</th><th class="l">phase</th><th>allocated at</th><th>segment</th><th>offset</th></tr>` +
    shown.map(b => `<tr><td>${fmt(b.size)}</td><td class="l">${esc(b.tag)}</td><td class="l">${esc(b.phase)}</td>` +
      `<td>${ms(b.t - t0)}</td><td>${b.segment === undefined ? "" : b.segment}</td>` +
      `<td>${b.offset === undefined ? "" : fmt(b.offset)}</td></tr>`).join("") +
    (lb.length > shown.length ? `<tr><td class="l" colspan="6">and ${lb.length - shown.length} smaller blocks</td></tr>` : "");
  if (document.body.dataset.rendered !== "error") document.body.dataset.rendered = "ok";
})();
</script>
</body></html>
)HTML";

}  // namespace

std::string memory_trace_html(const nlohmann::json& analysis) {
  const std::string data = analysis.dump();
  // No "</" inside the script element: copied in one pass (replacing in place moved the rest of
  // the data at every occurrence).
  std::string page = kHead;
  page.reserve(page.size() + data.size() + std::char_traits<char>::length(kTail));
  size_t from = 0;
  for (size_t p = data.find("</"); p != std::string::npos; p = data.find("</", from)) {
    page.append(data, from, p - from).append("<\\/");
    from = p + 2;
  }
  page.append(data, from, std::string::npos);
  return page + kTail;
}

}  // namespace leantune
