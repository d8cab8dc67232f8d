# Sourced by the page tests (lengths_plot.sh, plot.sh, memviz.sh): headless Chromium helpers.
# Needs $tmp (a scratch folder) and a fail() function. Each check page ends with a script that
# sets body[data-check] to "ok" or to the problems it found.
#   find_browser                    sets $browser; exit 77 (skipped) without chromium
#   run_browser ARGS... URL         chromium --headless with a profile in $tmp
#   expect_page_ok PAGE WHAT        --dump-dom of PAGE; fail "WHAT: problems" unless data-check
#                                   is "ok" (console lines of the page added to the message)
#   screenshot PAGE PNG WxH MIN     a screenshot of PAGE into PNG; fail when it is smaller than
#                                   MIN bytes (a blank page compresses to a few KiB)
find_browser() {
  browser=$(command -v chromium || command -v chromium-browser || true)
  [ -n "$browser" ] || { echo "chromium not installed (scripts/setup.sh installs it): skipped"; exit 77; }
}
run_browser() { timeout 120 "$browser" --headless --disable-gpu --no-sandbox --no-first-run \
  --user-data-dir="$tmp/profile" --enable-logging=stderr --v=0 "$@"; }
expect_page_ok() {
  local page=$1 what=$2 check
  run_browser --window-size=1200,1800 --dump-dom "file://$page" >"$tmp/dom.html" \
    2>"$tmp/console.log" || fail "chromium --dump-dom failed ($what)"
  check=$(grep -o 'data-check="[^"]*"' "$tmp/dom.html" || true)
  [ "$check" = 'data-check="ok"' ] ||
    fail "$what: ${check:-the check did not run} $(grep ':CONSOLE' "$tmp/console.log" | head -3)"
}
screenshot() {
  local page=$1 png=$2 size
  mkdir -p "$(dirname "$png")"
  rm -f "$png"
  run_browser --window-size="$3" --screenshot="$png" "file://$page" >/dev/null 2>&1 ||
    fail "screenshot failed"
  size=$(stat -c %s "$png" 2>/dev/null || echo 0)
  [ "$size" -gt "$4" ] || fail "the screenshot $png looks blank ($size bytes)"
}
