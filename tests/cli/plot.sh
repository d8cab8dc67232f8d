#!/usr/bin/env bash
# trainer_bin plot on a short sft run of the embedded demo, the page checked in headless
# Chromium: the charts of loss, learning rate, grad norm, tokens/s and memory exist, each draws
# every logged step, no text leaves its chart or overlaps another legend entry, and the page
# logs nothing; a screenshot goes to ARTIFACT_DIR/plot.png and must not be blank.
#   plot.sh TRAINER_BIN ARTIFACT_DIR        exit 77 (skipped) without chromium
set -euo pipefail
bin=$1 artifacts=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "plot: $*" >&2; exit 1; }
. "$(dirname "$0")/browser_check.sh"
find_browser

"$bin" sft --max_steps 4 --logging_steps 1 --max_length 64 --per_device_train_batch_size 2 \
  --save_steps 0 --output_dir "$tmp/run" >"$tmp/train.log" 2>&1 || fail "sft failed: $(tail -3 "$tmp/train.log")"
out=$("$bin" plot "$tmp/run") || fail "plot exited $?"
echo "$out"
echo "$out" | grep -q "4 records" || fail "expected 4 records: $out"
page=$tmp/run/curves.html
[ -s "$page" ] || fail "no page written"
# A missing run is exit 2 with one line.
set +e
"$bin" plot "$tmp/nothing" >/dev/null 2>"$tmp/err"
rc=$?
set -e
[ $rc -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "a missing run: exit $rc, $(cat "$tmp/err")"

cp "$page" "$tmp/check.html"
cat >>"$tmp/check.html" <<'JS'
<script>
(function () {
  const problems = [];
  const want = ['loss', 'learning_rate', 'grad_norm', 'tokens/s', 'memory (GiB)'];
  const charts = [...document.querySelectorAll('svg.chart')];
  for (const w of want)
    if (!charts.some(c => c.getAttribute('data-chart') === w)) problems.push('no chart ' + w);
  for (const c of charts) {
    // Rendered boxes (transforms applied), relative to the chart.
    const frame = c.getBoundingClientRect();
    const box = t => { const r = t.getBoundingClientRect();
                       return {x: r.left - frame.left, y: r.top - frame.top, width: r.width, height: r.height}; };
    for (const t of c.querySelectorAll('text')) {
      const b = box(t);
      if (b.x < -0.5 || b.y < -0.5 || b.x + b.width > frame.width + 0.5 || b.y + b.height > frame.height + 0.5)
        problems.push(c.getAttribute('data-chart') + ': "' + t.textContent + '" outside');
    }
    const legend = [...c.querySelectorAll('text.legend')].map(box);
    for (let i = 0; i < legend.length; ++i)
      for (let j = i + 1; j < legend.length; ++j) {
        const a = legend[i], b = legend[j];
        if (a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height)
          problems.push(c.getAttribute('data-chart') + ': legend entries overlap');
      }
    const lines = c.querySelectorAll('polyline.series');
    if (!lines.length) problems.push(c.getAttribute('data-chart') + ': no series');
    for (const l of lines)
      if (l.points.length !== 4) problems.push(c.getAttribute('data-chart') + ': ' +
                                               l.points.length + ' points, not 4');
  }
  document.body.setAttribute('data-check', problems.length ? problems.join('; ') : 'ok');
})();
</script>
JS
expect_page_ok "$tmp/check.html" page
screenshot "$page" "$artifacts/plot.png" 1200,1000 20000
cp "$page" "$artifacts/plot.html"
echo "plot chromium: ok ($artifacts/plot.png)"
