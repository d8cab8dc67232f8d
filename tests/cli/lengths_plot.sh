#!/usr/bin/env bash
# trainer_bin lengths --plot on the demo stories (data/embedded), the SVG checked in headless
# Chromium: a page holding the SVG inline measures every text with getBBox() and the DOM it
# leaves says whether every label lies inside the picture, the marker labels (p50, p90, p99,
# max_length) overlap neither each other nor the tick labels, and the x ticks are round
# (multiples of 1, 2 or 5 x 10^k). A screenshot of the SVG goes to ARTIFACT_DIR/lengths.png and
# must not be blank (a blank 900-pixel-wide PNG is a few KiB).
#   lengths_plot.sh TRAINER_BIN SOURCE_DIR ARTIFACT_DIR     exit 77 (skipped) without chromium
set -euo pipefail
bin=$1 src=$2 artifacts=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "lengths_plot: $*" >&2; exit 1; }
. "$(dirname "$0")/browser_check.sh"
find_browser

"$bin" lengths --dataset "$src/data/embedded/stories.jsonl" --tokenizer "$src/data/embedded" \
  --plot "$tmp/lengths.svg" >"$tmp/out" 2>&1 || fail "lengths --plot failed: $(cat "$tmp/out")"
grep -q '>max_length [0-9]*</text>' "$tmp/lengths.svg" || fail "no max_length label"

{
  echo '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">'
  cat "$tmp/lengths.svg"
  cat <<'JS'
<script>
(function () {
  const svg = document.querySelector('svg');
  const problems = [];
  // Rendered boxes (the rotated axis title too), relative to the picture.
  const frame = svg.getBoundingClientRect();
  const box = t => { const r = t.getBoundingClientRect();
                     return {x: r.left - frame.left, y: r.top - frame.top, width: r.width, height: r.height}; };
  for (const t of svg.querySelectorAll('text')) {
    const b = box(t);
    if (b.x < -0.5 || b.y < -0.5 || b.x + b.width > frame.width + 0.5 || b.y + b.height > frame.height + 0.5)
      problems.push('outside: "' + t.textContent + '"');
  }
  const marks = [...svg.querySelectorAll('text.mark')];
  const ticks = [...svg.querySelectorAll('text.tick-x'), ...svg.querySelectorAll('text.tick-y')];
  const overlap = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width &&
                            a.y < b.y + b.height && b.y < a.y + a.height;
  for (let i = 0; i < marks.length; ++i) {
    for (let j = i + 1; j < marks.length; ++j)
      if (overlap(box(marks[i]), box(marks[j])))
        problems.push('overlap: "' + marks[i].textContent + '" "' + marks[j].textContent + '"');
    for (const t of ticks)
      if (overlap(box(marks[i]), box(t)))
        problems.push('overlap: "' + marks[i].textContent + '" tick "' + t.textContent + '"');
  }
  const xs = [...svg.querySelectorAll('text.tick-x')].map(t => Number(t.textContent));
  if (xs.length < 3) problems.push('fewer than 3 x ticks');
  const step = xs[1] - xs[0];
  const round = s => s > 0 && [1, 2, 5].some(m => { const k = Math.log10(s / m);
                                                     return Math.abs(k - Math.round(k)) < 1e-9; });
  if (!round(step)) problems.push('x tick step ' + step + ' is not 1, 2 or 5 x 10^k');
  xs.forEach((x, i) => { if (x !== i * step) problems.push('x tick ' + x + ' off the grid'); });
  if (marks.length < 4) problems.push('expected 4 marker labels, found ' + marks.length);
  document.body.setAttribute('data-check', problems.length ? problems.join('; ') : 'ok');
})();
</script></body></html>
JS
} >"$tmp/page.html"

expect_page_ok "$tmp/page.html" layout
screenshot "$tmp/lengths.svg" "$artifacts/lengths.png" 900,520 12000
cp "$tmp/lengths.svg" "$artifacts/lengths.svg"
echo "lengths plot chromium: ok (labels inside and apart, round ticks; $artifacts/lengths.png)"
