#!/usr/bin/env bash
# trainer_bin sft --memory_trace on the embedded demo, then trainer_bin memviz on that trace.
#   memviz.sh TRAINER_BIN ARTIFACT_DIR cli       the trace, the page, malformed traces (exit 2)
#   memviz.sh TRAINER_BIN ARTIFACT_DIR chromium  the page in headless Chromium: it renders with
#       no script error, the peak marker and the tag legend exist, and a screenshot is written
#       to ARTIFACT_DIR/memviz.png; exit 77 (skipped) without chromium.
set -euo pipefail
bin=$1 artifacts=$2 mode=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "memviz: $*" >&2; exit 1; }
if [ "$mode" = chromium ]; then
  browser=$(command -v chromium || command -v chromium-browser || true)
  [ -n "$browser" ] || { echo "chromium not installed (scripts/setup.sh installs it): skipped"; exit 77; }
fi

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
run_browser() { timeout 120 "$browser" --headless --disable-gpu --no-sandbox --no-first-run \
  --user-data-dir="$tmp/profile" --enable-logging=stderr --v=0 "$@" "file://$page"; }
run_browser --dump-dom >"$tmp/dom.html" 2>"$tmp/console.log" || fail "chromium --dump-dom failed"
grep -q 'data-rendered="ok"' "$tmp/dom.html" || fail "the page's script did not finish: $(grep -i console "$tmp/console.log" | head -3)"
# The page logs nothing itself: any console line (an error, an uncaught exception) fails.
if grep -q ':CONSOLE' "$tmp/console.log"; then
  fail "console messages: $(grep ':CONSOLE' "$tmp/console.log" | head -3)"
fi
grep -q 'id="peak-marker"' "$tmp/dom.html" || fail "no peak marker"
[ "$(grep -Eo 'class="legend-item" data-tag="[a-z_]+"' "$tmp/dom.html" | sort -u | wc -l)" -eq 8 ] || fail "the tag legend does not list the 8 tags"
grep -q 'class="band" data-tag="activation"' "$tmp/dom.html" || fail "no activation band in the timeline"
mkdir -p "$artifacts"
rm -f "$artifacts/memviz.png"
run_browser --window-size=1200,1800 --screenshot="$artifacts/memviz.png" >/dev/null 2>&1 || fail "screenshot failed"
[ -s "$artifacts/memviz.png" ] || fail "no screenshot written"
cp "$page" "$artifacts/memviz.html"
echo "memviz chromium: ok (screenshot $artifacts/memviz.png)"
