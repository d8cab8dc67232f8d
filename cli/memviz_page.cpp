// The HTML page of trainer_bin memviz: one self-contained file (inline script, SVG built as
// markup, no fonts, images or scripts fetched) that draws the analysis of memory_trace.cpp:
//   - allocated bytes stacked by tag over time, the peak marked (#peak-marker), a tag legend
//     (#legend) with each tag's bytes at the peak, phase starts (.phase-boundary) and the end
//     of each update (.step-marker); the mouse zooms (wheel), pans (drag) and resets
//     (double-click) the time axis, and hovering shows the bytes by tag, the reserved bytes and
//     the phase at that moment (#tooltip);
//   - the live blocks at the peak, largest first, with the phase that allocated them;
//   - reserved vs allocated over time (the gap is the cache's fragmentation and slack);
//   - each segment at the peak with its blocks placed at their offsets; hovering a block shows
//     its tag, size, phase, allocation site and time (#block-tooltip).
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
.hint { color: #666; margin: 2px 0 8px; }
.chart-wrap { position: relative; display: inline-block; }
#timeline svg { cursor: crosshair; user-select: none; }
.tooltip { position: absolute; pointer-events: none; background: rgba(255,255,255,0.96);
  border: 1px solid #999; padding: 4px 7px; font: 12px sans-serif; white-space: nowrap;
  box-shadow: 1px 1px 4px rgba(0,0,0,0.2); z-index: 2; }
.tooltip td { padding: 0 6px 0 0; text-align: left; }
</style></head>
<body data-rendered="no">
<h1>leantune memory trace</h1>
<table class="summary" id="summary"></table>
<h2>Allocated bytes by tag over time</h2>
<p class="hint">Hover for the bytes by tag and the phase; wheel to zoom, drag to pan,
double-click for the whole trace. Thin dotted lines start phases, solid ones end updates.</p>
<div id="legend"></div>
<div class="chart-wrap"><div id="timeline"></div><div id="tooltip" class="tooltip" hidden></div></div>
<h2>Reserved vs allocated over time</h2>
<div id="fragmentation-chart"></div>
<h2>Segments at the peak</h2>
<p>Blocks allocated within the trace, placed at their offsets; grey is cached free space. Hover a
block for its tag, size, phase and allocation site.</p>
<div class="chart-wrap"><div id="segments"></div><div id="block-tooltip" class="tooltip" hidden></div></div>
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
  // The time axis runs to the last event or the last update's end, whichever is later.
  const ends = D.step_ends || [];
  const tl = D.timeline, T0 = tl[0].t,
        T1 = Math.max(tl[tl.length - 1].t, T0 + 1, ...ends.map(e => e.t));
  const W = 1100, H = 310, L = 80, R = 46, T = 36, B = 30;
  const view = {a: T0, b: T1};
  const X = t => L + (t - view.a) / (view.b - view.a) * (W - L - R);
  const tOf = x => view.a + (x - L) / (W - L - R) * (view.b - view.a);
  // Round ticks (1, 2 or 5 x 10^k) over [a, b].
  function ticks(a, b, n) {
    const raw = (b - a) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
    const out = [];
    for (let v = Math.ceil(a / step) * step; v <= b + step * 1e-9; v += step) out.push(v);
    return out;
  }
  function axes(maxY, Y) {
    let s = "";
    for (let k = 0; k <= 4; k++) {
      const v = maxY * k / 4, y = Y(v);
      s += `<line x1="${L}" x2="${W - R}" y1="${y}" y2="${y}" stroke="#ddd"/>` +
           `<text x="${L - 6}" y="${y + 4}" text-anchor="end">${fmt(v)}</text>`;
    }
    // Time ticks in ms from the trace's start; the last label stays inside the picture.
    for (const v of ticks((view.a - T0) / 1e6, (view.b - T0) / 1e6, 7)) {
      const x = X(T0 + v * 1e6), label = +v.toPrecision(6) + " ms";
      const anchor = x + 3.5 * label.length > W - 2 ? "end" : "middle";
      s += `<text class="tick-x" x="${x}" y="${H - 10}" text-anchor="${anchor}">${label}</text>`;
    }
    return s;
  }
  // The plot area clips what leaves the view (a nested svg, so the page references nothing).
  const clipOpen = `<svg x="${L}" y="0" width="${W - L - R}" height="${H}" overflow="hidden"><g transform="translate(${-L},0)">`;
  const clipClose = `</g></svg>`;
  const pk = D.peak, baseTotal = D.baseline.by_tag.reduce((a, b) => a + b, 0);
  const spans = D.phase_spans || [];
  function phaseAt(t) {
    let lo = 0, hi = spans.length - 1, best = null;
    while (lo <= hi) {
      const m = (lo + hi) >> 1;
      if (spans[m].t0 <= t) { best = spans[m]; lo = m + 1; } else hi = m - 1;
    }
    return best ? best.phase : "";
  }
  function pointAt(t) {
    let lo = 0, hi = tl.length - 1;
    while (lo < hi) { const m = (lo + hi) >> 1; if (tl[m].t < t) lo = m + 1; else hi = m; }
    if (lo > 0 && Math.abs(tl[lo - 1].t - t) <= Math.abs(tl[lo].t - t)) lo--;
    return tl[lo];
  }

  // Summary.
  const rows = [
    ["device", D.device], ["updates recorded", (D.steps || []).join(" to ") || "?"],
    ["events", D.events], ["peak allocated", fmt(pk.allocated) + " at " + ms(pk.t - T0) + " (" + pk.phase + ")"],
    ["reserved at the peak", fmt(pk.reserved)],
    ["fragmentation at the peak", fmt(pk.reserved - pk.allocated) + " (" +
      (pk.reserved > 0 ? (100 * (pk.reserved - pk.allocated) / pk.reserved).toFixed(1) : "0") + "% of reserved)"],
    ["allocated before the trace", fmt(baseTotal)], ["out-of-memory events", D.ooms]];
  document.getElementById("summary").innerHTML =
    rows.map(r => `<tr><td>${esc(r[0])}</td><td>${esc(r[1])}</td></tr>`).join("");
  document.getElementById("legend").innerHTML = D.tags.map((tag, ti) =>
    `<span class="legend-item" data-tag="${tag}"><span class="swatch" style="background:${COLORS[tag]}"></span>` +
    `${tag}: ${fmt(pk.by_tag[ti])} at the peak</span>`).join("");

  // Phase starts (dotted, labelled where there is room) and update ends (solid) in the view.
  function boundaries() {
    let s = "", lastLabel = -1e9;
    spans.forEach((sp, k) => {
      if (sp.t1 < view.a || sp.t0 > view.b) return;
      const x = X(Math.max(sp.t0, view.a));
      if (k > 0 && sp.t0 >= view.a)
        s += `<line class="phase-boundary" x1="${x}" x2="${x}" y1="${T}" y2="${H - B}" stroke="#999" stroke-dasharray="1,3"/>`;
      const room = X(Math.min(sp.t1, view.b)) - x, label = sp.phase;
      if (room > 6.2 * label.length + 6 && x > lastLabel) {
        s += `<text class="phase-label" x="${x + 3}" y="${T - 4}" fill="#666">${esc(label)}</text>`;
        lastLabel = x + 6.2 * label.length + 6;
      }
    });
    ends.forEach(e => {
      if (e.t < view.a || e.t > view.b) return;
      const x = X(e.t), label = "end of update " + e.step, left = x - 3 - 6.5 * label.length >= 0;
      s += `<g class="step-marker" data-step="${e.step}"><line x1="${x}" x2="${x}" y1="2" y2="${H - B}" stroke="#222" stroke-width="1.2"/>` +
           `<text x="${left ? x - 3 : x + 3}" y="11" text-anchor="${left ? "end" : "start"}" font-weight="bold">${label}</text></g>`;
    });
    return s;
  }

  // Stacked timeline with the peak marked, redrawn for the view.
  const maxA = Math.max(1, pk.allocated);
  const YA = v => T + (1 - Math.max(0, v) / maxA) * (H - T - B);
  const maxR = Math.max(1, ...tl.map(p => p.reserved), pk.allocated);
  const YR = v => T + (1 - Math.max(0, v) / maxR) * (H - T - B);
  const total = p => p.tags.reduce((a, b) => a + Math.max(0, b), 0);
  function draw() {
    let svg = `<svg width="${W}" height="${H}" id="timeline-svg">` + axes(maxA, YA) + clipOpen;
    const cum = tl.map(() => 0);
    D.tags.forEach((tag, ti) => {
      const lo = cum.slice();
      tl.forEach((p, i) => { cum[i] += Math.max(0, p.tags[ti]); });
      if (tl.every((p, i) => cum[i] === lo[i])) return;
      let d = "M" + tl.map((p, i) => X(p.t).toFixed(1) + "," + YA(cum[i]).toFixed(1)).join("L");
      for (let i = tl.length - 1; i >= 0; i--) d += "L" + X(tl[i].t).toFixed(1) + "," + YA(lo[i]).toFixed(1);
      svg += `<path class="band" data-tag="${tag}" d="${d}Z" fill="${COLORS[tag]}" fill-opacity="0.85"/>`;
    });
    svg += clipClose + boundaries();
    const px = X(pk.t), pkIn = px >= L && px <= W - R, pkLabel = `peak ${fmt(pk.allocated)} (${pk.phase})`;
    const pkLeft = px + 4 + 6.2 * pkLabel.length > W - 2;
    svg += `<g id="peak-marker" visibility="${pkIn ? "visible" : "hidden"}"><line x1="${px}" x2="${px}" y1="${T}" y2="${H - B}" stroke="#d00" stroke-width="1.5" stroke-dasharray="4,3"/>` +
           `<text x="${pkLeft ? px - 4 : px + 4}" y="${T + 12}" fill="#d00" text-anchor="${pkLeft ? "end" : "start"}">${esc(pkLabel)}</text></g>` +
           `<line id="cursor" x1="0" x2="0" y1="${T}" y2="${H - B}" stroke="#000" visibility="hidden"/></svg>`;
    document.getElementById("timeline").innerHTML = svg;
    const line = f => tl.map(p => X(p.t).toFixed(1) + "," + YR(f(p)).toFixed(1)).join(" ");
    document.getElementById("fragmentation-chart").innerHTML =
      `<svg width="${W}" height="${H}">` + axes(maxR, YR) + clipOpen +
      `<polyline fill="none" stroke="#333" stroke-width="1.5" points="${line(p => p.reserved)}"/>` +
      `<polyline fill="none" stroke="#4e79a7" stroke-width="1.5" points="${line(total)}"/>` +
      `<line x1="${px}" x2="${px}" y1="${T}" y2="${H - B}" stroke="#d00" stroke-dasharray="4,3"/>` + clipClose +
      `<text x="${L + 8}" y="${T - 8}">black: reserved, blue: allocated; the gap is cached free memory</text></svg>`;
  }
  draw();

  // Zoom (wheel, about the cursor), pan (drag), reset (double-click), hover (tooltip).
  const wrap = document.getElementById("timeline"), tip = document.getElementById("tooltip");
  const localX = ev => ev.clientX - wrap.getBoundingClientRect().left;
  function setView(a, b) {
    const minW = Math.min(T1 - T0, 1000);
    if (b - a < minW) { const c = (a + b) / 2; a = c - minW / 2; b = c + minW / 2; }
    if (b - a > T1 - T0) { a = T0; b = T1; }
    if (a < T0) { b += T0 - a; a = T0; }
    if (b > T1) { a -= b - T1; b = T1; }
    view.a = a; view.b = b;
    draw();
  }
  wrap.addEventListener("wheel", ev => {
    ev.preventDefault();
    const c = tOf(localX(ev)), f = ev.deltaY < 0 ? 0.8 : 1.25;
    setView(c - (c - view.a) * f, c + (view.b - c) * f);
  }, {passive: false});
  let drag = null;
  wrap.addEventListener("mousedown", ev => { drag = {x: localX(ev), a: view.a, b: view.b}; });
  window.addEventListener("mouseup", () => { drag = null; });
  wrap.addEventListener("dblclick", () => setView(T0, T1));
  wrap.addEventListener("mouseleave", () => { tip.hidden = true; });
  wrap.addEventListener("mousemove", ev => {
    const x = localX(ev);
    if (drag) {
      const dt = (x - drag.x) / (W - L - R) * (drag.b - drag.a);
      setView(drag.a - dt, drag.b - dt);
      return;
    }
    const cur = document.getElementById("cursor");
    if (x < L || x > W - R) { tip.hidden = true; cur.setAttribute("visibility", "hidden"); return; }
    const p = pointAt(tOf(x));
    cur.setAttribute("x1", X(p.t)); cur.setAttribute("x2", X(p.t)); cur.setAttribute("visibility", "visible");
    tip.innerHTML = `<b>${ms(p.t - T0)}</b> ${esc(phaseAt(p.t))}<table>` +
      `<tr><td>allocated</td><td>${fmt(total(p))}</td></tr>` +
      D.tags.map((tag, ti) => p.tags[ti] > 0 ? `<tr data-tag="${tag}"><td>${tag}</td><td>${fmt(p.tags[ti])}</td></tr>` : "").join("") +
      `<tr><td>reserved</td><td>${fmt(p.reserved)}</td></tr></table>`;
    tip.hidden = false;
    tip.style.left = Math.min(x + 12, W - 200) + "px";
    tip.style.top = (ev.clientY - wrap.getBoundingClientRect().top + 12) + "px";
  });

  // Segments at the peak; a block's details on hover.
  const SW = 760, blocks = [];
  document.getElementById("segments").innerHTML = D.segments_at_peak.map(s => {
    let r = "";
    s.blocks.forEach(b => {
      blocks.push(b);
      r += `<rect class="block" data-block="${blocks.length - 1}" x="${(b.offset / s.size * SW).toFixed(1)}" width="${Math.max(1, b.size / s.size * SW).toFixed(1)}" ` +
           `height="14" fill="${COLORS[b.tag]}"></rect>`;
    });
    const free = s.size - s.allocated;
    return `<div class="seg"><span>segment ${s.id}: ${fmt(s.size)}, ${(100 * free / s.size).toFixed(0)}% free</span>` +
           `<svg width="${SW}" height="14"><rect width="${SW}" height="14" fill="#ddd"/>${r}</svg></div>`;
  }).join("") || "<p>No segment was created within the trace (all came from the cache).</p>";
  const segs = document.getElementById("segments"), btip = document.getElementById("block-tooltip");
  segs.addEventListener("mousemove", ev => {
    const k = ev.target.getAttribute && ev.target.getAttribute("data-block");
    if (k === null || k === undefined) { btip.hidden = true; return; }
    const b = blocks[+k], box = segs.getBoundingClientRect();
    btip.innerHTML = `<b>${fmt(b.size)}</b> ${esc(b.tag)}<table>` +
      `<tr><td>phase</td><td>${esc(b.phase)}</td></tr>` +
      `<tr><td>site</td><td>${esc(b.site || "(not recorded)")}</td></tr>` +
      `<tr><td>allocated at</td><td>${ms(b.t - T0)}</td></tr>` +
      `<tr><td>offset</td><td>${fmt(b.offset)}</td></tr></table>`;
    btip.hidden = false;
    btip.style.left = (ev.clientX - box.left + 12) + "px";
    btip.style.top = (ev.clientY - box.top + 12) + "px";
  });
  segs.addEventListener("mouseleave", () => { btip.hidden = true; });

  // Live blocks at the peak.
  const lb = D.live_at_peak, shown = lb.slice(0, 200);
  document.getElementById("live-blocks").innerHTML =
    `<tr><th>size</th><th class="l">tag</th><th class="l">phase</th><th class="l">site</th><th>allocated at</th><th>segment</th><th>offset</th></tr>` +
    shown.map(b => `<tr><td>${fmt(b.size)}</td><td class="l">${esc(b.tag)}</td><td class="l">${esc(b.phase)}</td>` +
      `<td class="l">${esc(b.site || "")}</td><td>${ms(b.t - T0)}</td><td>${b.segment === undefined ? "" : b.segment}</td>` +
      `<td>${b.offset === undefined ? "" : fmt(b.offset)}</td></tr>`).join("") +
    (lb.length > shown.length ? `<tr><td class="l" colspan="7">and ${lb.length - shown.length} smaller blocks</td></tr>` : "");
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
