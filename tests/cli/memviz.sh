#!/usr/bin/env bash
# trainer_bin sft --memory_trace on the embedded demo, then trainer_bin memviz on that trace.
#   memviz.sh TRAINER_BIN ARTIFACT_DIR cli       the trace, the page, malformed traces (exit 2)
#   memviz.sh TRAINER_BIN ARTIFACT_DIR chromium  the page in headless Chromium: it renders with
#       no script error, the peak marker and the tag legend exist, hover, zoom and the block
#       tooltip work under synthetic events, update ends, phase starts and allocation sites are
#       shown, and a non-blank screenshot is written to ARTIFACT_DIR/memviz.png; exit 77
#       (skipped) without chromium.
set -euo pipefail
bin=$1 artifacts=$2 mode=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "memviz: $*" >&2; exit 1; }
. "$(dirname "$0")/browser_check.sh"
if [ "$mode" = chromium ]; then find_browser; fi

"$bin" sft --max_steps 2 --max_length 64 --per_device_train_batch_size 2 \
  --output_dir "$tmp/out" --memory_trace "$tmp/trace.json" --memory_trace_steps 2 >/dev/null 2>&1 ||
  fail "sft with --memory_trace failed"
grep -q '"phase":"backward layer 0"' "$tmp/trace.json" || fail "no backward phase in the trace"
grep -q '"phase":"optimizer"' "$tmp/trace.json" || fail "no optimizer phase in the trace"
grep -q '"steps":\[1,2\]' "$tmp/trace.json" || fail "the trace does not name updates 1 to 2"
out=$("$bin" memviz "$tmp/trace.json" -o "$tmp/trace.html") || fail "memviz exited $?"
echo "$out"
echo "$out" | grep -q "peak allocated" || fail "no peak on stdout"
page=$tmp/trace.html

if [ "$mode" = cli ]; then
  # Self-contained: nothing fetched (no external script, style, image, font or link).
  if grep -Eiq '(src|href)=|@import|url\(|https?://' "$page"; then fail "the page refers outside itself"; fi
  grep -q 'id="peak-marker"' "$page" || fail "no peak marker element"
  # Malformed traces: exit 2, one line naming the file (and the event).
  bad() {
    local name=$1 content=$2 expect=$3
    printf '%s' "$content" >"$tmp/$name"
    set +e
    "$bin" memviz "$tmp/$name" -o "$tmp/bad.html" >/dev/null 2>"$tmp/err"
    local rc=$?
    set -e
    [ $rc -eq 2 ] || fail "$name: exit $rc, expected 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "$name: stderr is not one line: $(cat "$tmp/err")"
    grep -q "$name" "$tmp/err" || fail "$name: the error does not name the file"
    grep -q "$expect" "$tmp/err" || fail "$name: expected '$expect' in: $(cat "$tmp/err")"
  }
  bad notjson.json '{"events": [' "notjson.json"
  bad noevents.json '{"device": "cpu"}' "no 'events' array"
  bad badsize.json '{"events": [{"kind":"alloc","id":1,"size":"big","tag":"param","stream":0,"t_ns":0}]}' "event 0: 'size' must be an integer"
  bad badkind.json '{"events": [{"kind":"alloc","id":1,"size":8,"tag":"param","stream":0,"t_ns":0},{"kind":"realloc","id":1,"size":8,"tag":"param","stream":0,"t_ns":1}]}' "event 1: unknown kind 'realloc'"
  bad badtag.json '{"events": [{"kind":"alloc","id":1,"size":8,"tag":"weights","stream":0,"t_ns":0}]}' "unknown tag 'weights'"
  set +e
  "$bin" memviz "$tmp/missing.json" -o "$tmp/x.html" >/dev/null 2>&1
  [ $? -eq 2 ] || fail "a missing trace file is not exit 2"
  set -e
  echo "memviz cli: ok"
  exit 0
fi

# Headless Chromium: the DOM after the script ran, then a screenshot.
run_browser --dump-dom "file://$page" >"$tmp/dom.html" 2>"$tmp/console.log" ||
  fail "chromium --dump-dom failed"
grep -q 'data-rendered="ok"' "$tmp/dom.html" || fail "the page's script did not finish: $(grep -i console "$tmp/console.log" | head -3)"
# The page logs nothing itself: any console line (an error, an uncaught exception) fails.
if grep -q ':CONSOLE' "$tmp/console.log"; then
  fail "console messages: $(grep ':CONSOLE' "$tmp/console.log" | head -3)"
fi
grep -q 'id="peak-marker"' "$tmp/dom.html" || fail "no peak marker"
[ "$(grep -Eo 'class="legend-item" data-tag="[a-z_]+"' "$tmp/dom.html" | sort -u | wc -l)" -eq 8 ] || fail "the tag legend does not list the 8 tags"
grep -q 'class="band" data-tag="activation"' "$tmp/dom.html" || fail "no activation band in the timeline"
# Interaction, by synthetic events in a copy of the page: hovering the timeline shows the bytes
# and the phase, the wheel zooms the time axis, hovering a block names its site; the update ends
# and phase starts are drawn, the live blocks name their sites, the time labels stay inside.
cp "$page" "$tmp/interact.html"
cat >>"$tmp/interact.html" <<'JS'
<script>
(function () {
  const problems = [];
  const q = s => document.querySelector(s), qa = s => [...document.querySelectorAll(s)];
  if (qa('.step-marker').length !== 2) problems.push(qa('.step-marker').length + ' update ends, not 2');
  if (!qa('.phase-boundary').length) problems.push('no phase boundary');
  const frame = q('#timeline-svg').getBoundingClientRect();
  for (const t of qa('#timeline-svg text')) {
    const r = t.getBoundingClientRect();
    if (r.width > 0 && (r.left < frame.left - 0.5 || r.right > frame.right + 0.5))
      problems.push('label outside: ' + t.textContent);
  }
  const sites = qa('#live-blocks td:nth-child(4)').map(td => td.textContent);
  if (!sites.some(s => /mlp|self_attn|Backward|lm_head/.test(s))) problems.push('no allocation site in the live blocks');
  const box = q('#timeline').getBoundingClientRect();
  const at = (type, x, extra) => q('#timeline').dispatchEvent(new (type === 'wheel' ? WheelEvent : MouseEvent)(
      type, Object.assign({bubbles: true, cancelable: true, clientX: box.left + x, clientY: box.top + 150}, extra || {})));
  at('mousemove', 500);
  const tip = q('#tooltip');
  if (tip.hidden || !/allocated/.test(tip.textContent) || !/ms/.test(tip.textContent)) problems.push('no hover tooltip: ' + tip.textContent);
  const before = qa('#timeline-svg text.tick-x').map(t => t.textContent).join(' ');
  at('wheel', 500, {deltaY: -100}); at('wheel', 500, {deltaY: -100}); at('wheel', 500, {deltaY: -100});
  const after = qa('#timeline-svg text.tick-x').map(t => t.textContent).join(' ');
  if (before === after) problems.push('the wheel did not zoom: ' + after);
  q('#timeline').dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
  if (qa('#timeline-svg text.tick-x').map(t => t.textContent).join(' ') !== before) problems.push('double-click did not reset');
  const block = q('rect.block');
  if (block) {
    const r = block.getBoundingClientRect();
    block.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: r.left + 1, clientY: r.top + 1}));
    const bt = q('#block-tooltip');
    if (bt.hidden || !/site/.test(bt.textContent) || !/phase/.test(bt.textContent)) problems.push('no block tooltip');
  }
  document.body.setAttribute('data-check', problems.length ? problems.join('; ') : 'ok');
})();
</script>
JS
expect_page_ok "$tmp/interact.html" interaction
screenshot "$page" "$artifacts/memviz.png" 1200,1800 20000
cp "$page" "$artifacts/memviz.html"
echo "memviz chromium: ok (screenshot $artifacts/memviz.png)"
