#!/usr/bin/env bash
# trainer_bin sft --profile_steps on the embedded demo (CPU timers): the printed table has the
# linear, attention, norm, loss and optimizer rows with calls, the "other" and step rows;
# profile.json parses, names updates 2 and 3 (update 1 is warm-up) and its rows plus "other" add
# up to the step; dpo takes the option too; a bad value is a one-line error, exit 2.
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "profile: $*" >&2; exit 1; }

"$bin" sft --device cpu --max_steps 3 --profile_steps 2 --output_dir "$tmp/out" 2>"$tmp/err" >/dev/null ||
  fail "sft --profile_steps failed: $(tail -3 "$tmp/err")"
sed -n '/^step profile:/,/^step  /p' "$tmp/err"
grep -q '^step profile: 2 step(s) on cpu (steady_clock)$' "$tmp/err" || fail "no table header"
for op in "linear fwd" "linear dx" "linear dW" "attention fwd" "attention bwd" norm loss optimizer; do
  grep -Eq "^$op +[1-9][0-9]* +[0-9.]+ +[0-9.]+ +[0-9.]+%$" "$tmp/err" || fail "no '$op' row with calls"
done
grep -Eq '^other \(not in any op\) +-?[0-9.]+ +-?[0-9.]+ +-?[0-9.]+%$' "$tmp/err" || fail "no other row"
grep -Eq '^step +[0-9.]+ +[0-9.]+ +100\.0%$' "$tmp/err" || fail "no step row"
python3 - "$tmp/out/profile.json" <<'PY' || fail "profile.json is not consistent"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["device"] == "cpu" and p["timer"] == "steady_clock", p
assert p["steps"] == 2 and p["updates"] == [2, 3], (p["steps"], p["updates"])
names = {r["op"] for r in p["ops"]}
for op in ["linear fwd", "linear dx", "linear dW", "attention fwd", "attention bwd", "norm",
           "loss", "optimizer"]:
    assert op in names, (op, names)
assert all(r["calls"] > 0 and r["ms"] >= 0 for r in p["ops"]), p["ops"]
# Optimizer: once per update.
assert [r["calls"] for r in p["ops"] if r["op"] == "optimizer"] == [2], p["ops"]
total = sum(r["ms"] for r in p["ops"]) + p["other_ms"]
assert abs(total - p["step_ms"]) <= 1e-6 * p["step_ms"], (total, p["step_ms"])
assert abs(sum(r["share"] for r in p["ops"]) + p["other_share"] - 1) < 1e-9
assert p["step_ms"] > 0 and abs(p["ms_per_step"] - p["step_ms"] / 2) < 1e-9
# Host clocks, one thread: the ops fit in the step.
assert p["other_ms"] >= 0, p["other_ms"]
PY

# Every trainer shares the loop: dpo takes the option (one update: the run has only one).
"$bin" dpo --device cpu --max_steps 1 --profile_steps 3 --output_dir "$tmp/dpo" 2>"$tmp/err" >/dev/null ||
  fail "dpo --profile_steps failed: $(tail -3 "$tmp/err")"
grep -q '^step profile: 1 step(s) on cpu' "$tmp/err" || fail "dpo: no table"
grep -q '"updates": \[' "$tmp/dpo/profile.json" || fail "dpo: no profile.json"

for bad in -1 x; do
  set +e
  "$bin" sft --device cpu --max_steps 3 --profile_steps "$bad" --output_dir "$tmp/bad" >/dev/null 2>"$tmp/err"
  rc=$?
  set -e
  [ $rc -eq 2 ] || fail "--profile_steps $bad: exit $rc, expected 2"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "--profile_steps $bad: stderr is not one line: $(cat "$tmp/err")"
  grep -q "profile_steps" "$tmp/err" || fail "--profile_steps $bad: the error does not name the option"
done
echo "profile: ok"
