#!/usr/bin/env bash
# gpu_suite.sh: build, test and benchmark leantune on a GPU machine in one command, and record
# the results in bench/results/<yyyy-mm-dd>-<gpu>.json.
#
#   bench/gpu_suite.sh            (from anywhere; it works in the repository root)
#
# Steps (each one's exit status and duration are recorded; a failing step is written into the
# JSON and the suite goes on with what can still run):
#   1. configure and build Release for sm_90 in build-gpu/ (the library, every test binary that
#      has CUDA tests, every benchmark);
#   2. the GPU test tier (`ctest -L gpu`), then compute-sanitizer memcheck on a short subset;
#   3. every benchmark in build-gpu/bench/ (each prints a JSON object; their "figures" are merged);
#   4. bench/results/<date>-<gpu>.json: {"commit", "date", "device", "figures", "steps", "errors"}
#      (also copied to $OUT when that is set, so that it comes back from a lent machine);
#   5. a short table on stdout.
# Budget: about 10 minutes on an H100 (the build is most of it). Every step gets a time limit
# within an overall deadline (SUITE_DEADLINE seconds, default 560: a lent machine kills a command
# at 600), and the JSON is rewritten after each step, so a cut-short run still reports what it
# did. SUITE_JOBS sets the build's parallelism (default: all cores); SUITE_SKIP="build tests
# sanitizer bench" skips steps: on a lent machine whose build outputs persist between calls, a
# first call with SUITE_SKIP="tests sanitizer bench" and a second with SUITE_SKIP=build split the
# work. On a lent machine the JSON and the step logs are copied to $OUT.
#
# Machines without a package registry: the build needs Debian's -dev packages. Prepare them here,
# in the repository root (carried/ is git-ignored; keep it under the 64 MiB a lent machine takes):
#   ../shared/tools/carry-debs carried googletest libgtest-dev nlohmann-json3-dev \
#       libopenblas-dev libopenblas-openmp-dev libopenblas0-openmp libpcre2-dev libutf8proc-dev \
#       libutf8proc2 libcli11-dev libfmt-dev libfmt9 libbenchmark-dev libbenchmark1debian \
#       pkgconf pkgconf-bin libpkgconf3
# (libopenmpi-dev can be added; MPI is optional and its runtime pulls in many packages.) When a
# directory carried/ exists, the suite runs `source carried/unpack.sh` before building, and points
# pkg-config at the unpacked files.
# shellcheck disable=SC2317  # the step functions run through `gpu_suite.sh --step NAME`
set -u
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cd "$(dirname "$SELF")/.." || exit 2
ROOT=$(pwd)
BUILD=$ROOT/build-gpu

log() { printf '[gpu_suite] %s\n' "$*" >&2; }

# ---------------------------------------------------------------- steps (run as children)

# Test binaries with CUDA tests (a suite name containing "Cuda"), and the benchmarks.
gpu_test_targets() {
  local f layer name
  for f in "$ROOT"/tests/*/test_*.cpp; do
    grep -q 'Cuda' "$f" || continue
    layer=$(basename "$(dirname "$f")")
    name=$(basename "$f" .cpp)
    printf '%s_%s\n' "$layer" "$name"
  done
}
bench_targets() {
  local f
  for f in "$ROOT"/bench/bench_*.cu "$ROOT"/bench/bench_*.cpp; do
    [ -e "$f" ] && basename "${f%.*}"
  done
}

step_build() {
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    -DLEANTUNE_CUDA=ON -DLEANTUNE_BUILD_TESTS=ON -DLEANTUNE_BUILD_BENCH=ON || return $?
  local targets rc=0 t
  targets="leantune $(gpu_test_targets | tr '\n' ' ') $(bench_targets | tr '\n' ' ')"
  # One parallel build of everything needed; if it fails, target by target, so that whatever can
  # be built still is.
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j "$JOBS" --target $targets && return 0
  for t in $targets; do cmake --build "$BUILD" -j "$JOBS" --target "$t" || rc=1; done
  return $rc
}

step_tests() {
  cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 240 -j 4
}

# Memcheck on a short subset of the cross-backend op table: the rows at bf16 71x229 (raw ops,
# rms_norm, swiglu, residual_add), index_rows, rms_norm at 5x896, cross_entropy at 71x229 and
# the fused AdamW.
step_sanitizer() {
  local cs rc=0 bin filter spec
  local row=Ops/BackendOpsCuda.MatchesCpu
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$cs" ] || { echo "compute-sanitizer not found"; return 127; }
  for spec in \
    "backend_test_ops:$row/*_bf16_71x229:$row/index_rows_bf16_*:$row/rms_norm_*_bf16_5x896" \
    "backend_test_ops:$row/cross_entropy_*_bf16_71x229_*:$row/adamw_mixed_tensors_*"; do
    bin=${spec%%:*}
    filter=${spec#*:}
    [ -x "$BUILD/$bin" ] || { echo "missing $bin"; rc=1; continue; }
    echo "== $bin --gtest_filter=$filter"
    (cd "$BUILD" && "$cs" --tool memcheck --leak-check no --error-exitcode 99 "./$bin" \
      --gtest_filter="$filter") || rc=1
  done
  return $rc
}

# Seconds one benchmark may run (on an H100): the training step runs leantune and the PyTorch
# baseline (bench/torch_baseline.py, python3 with torch + transformers) for two models.
bench_limit() {
  case "$1" in
    bench_train_step) echo 200 ;;
    bench_attention | bench_linear_ce) echo 90 ;;
    *) echo 150 ;;
  esac
}

step_bench() {
  local b r rc=0
  for b in $(bench_targets); do
    [ -x "$BUILD/bench/$b" ] || { echo "missing $b"; rc=1; continue; }
    echo "== $b"
    # CUDA benchmarks come first; each is capped so that one slow program cannot starve the rest.
    (cd "$BUILD" && LEANTUNE_ROOT="$ROOT" timeout "$(bench_limit "$b")" "./bench/$b" \
      >"$WORK/bench_$b.json" 2>"$WORK/bench_$b.err")
    r=$?
    cat "$WORK/bench_$b.err"
    [ $r -ne 0 ] && { echo "$b exited $r"; rc=1; }
  done
  return $rc
}

if [ "${1:-}" = "--step" ]; then
  "step_${2:?step name}"
  exit $?
fi

# ---------------------------------------------------------------- environment

JOBS=${SUITE_JOBS:-$(nproc)}
SKIP=${SUITE_SKIP:-}
DEADLINE=${SUITE_DEADLINE:-560}
START=$SECONDS
WORK=$(mktemp -d /tmp/gpu_suite.XXXXXX)
STEPS=$WORK/steps.tsv  # name, rc, seconds, note
: >"$STEPS"
export ROOT BUILD JOBS WORK

if [ -d "$ROOT/carried" ] && [ -f "$ROOT/carried/unpack.sh" ]; then
  log "unpacking carried packages"
  # shellcheck disable=SC1091
  source "$ROOT/carried/unpack.sh"
  _pfx=/opt/carried
  [ -d "$_pfx/usr/bin" ] && export PATH="$_pfx/usr/bin:$PATH"
  [ -x "$_pfx/usr/bin/pkgconf" ] && [ ! -e "$_pfx/usr/bin/pkg-config" ] &&
    ln -s pkgconf "$_pfx/usr/bin/pkg-config" 2>/dev/null
  _pc="$_pfx/usr/lib/x86_64-linux-gnu/pkgconfig"
  if [ -f "$_pc/libpcre2-8.pc" ]; then
    # The carried .pc files say prefix=/usr: let pkg-config map that into the unpacked tree.
    export PKG_CONFIG_PATH="$_pc:$_pfx/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export PKG_CONFIG_SYSROOT_DIR=$_pfx
  fi
fi
export PATH="/usr/local/cuda/bin:$PATH"

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$GPU_NAME" ] || GPU_NAME="unknown-gpu"
GPU_SLUG=$(printf '%s' "$GPU_NAME" | tr '[:upper:]' '[:lower:]' |
  sed -e 's/[[:space:]]\+/-/g' -e 's/[^a-z0-9._-]//g')
DATE=$(date -u +%Y-%m-%d)
COMMIT=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "${LEANTUNE_COMMIT:-unknown}")
mkdir -p "$ROOT/bench/results"
RESULT="$ROOT/bench/results/$DATE-$GPU_SLUG.json"
log "device: $GPU_NAME; commit $COMMIT; results: $RESULT"

# ---------------------------------------------------------------- results

write_results() {
  local summary
  summary=$(grep -E "tests passed|tests failed" "$WORK/tests.log" 2>/dev/null | tail -n 1)
  python3 - "$WORK" "$RESULT" "$COMMIT" "$DATE" "$GPU_NAME" "$summary" <<'PY'
import glob, json, os, sys
work, result, commit, date, device, test_summary = sys.argv[1:7]
figures, errors, steps = {}, {}, {}
for line in open(os.path.join(work, "steps.tsv")):
    name, rc, secs, note = (line.rstrip("\n").split("\t") + [""] * 4)[:4]
    steps[name] = {"rc": rc if rc == "skipped" else int(rc), "seconds": int(secs)}
    if note:
        steps[name]["note"] = note
    if rc not in ("0", "skipped"):
        errors["step_" + name] = "exit status %s %s; see %s.log" % (rc, note, name)
if test_summary and "tests" in steps:
    steps["tests"]["summary"] = test_summary.strip()
for path in sorted(glob.glob(os.path.join(work, "bench_*.json"))):
    bench = os.path.basename(path)[len("bench_"):-len(".json")]
    text = open(path).read().strip()
    if not text:
        errors[bench] = "no output"
        continue
    try:
        data = json.loads(text[text.find("{"):])
    except ValueError as e:
        errors[bench] = "output is not JSON: %s" % e
        continue
    if not isinstance(data, dict):
        continue
    nested = isinstance(data.get("figures"), dict)
    for k, v in (data["figures"] if nested else data).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            figures[k if nested else bench + "." + k] = v
    for k, v in (data.get("errors") or {}).items():
        errors[bench + "." + k] = v
out = {"commit": commit, "date": date, "device": device, "figures": figures, "steps": steps,
       "errors": errors}
with open(result, "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
    f.write("\n")
PY
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp "$RESULT" "$OUT"/ 2>/dev/null
    # Logs in one file: what comes back from a lent machine is limited to a few files.
    for f in "$WORK"/*.log; do [ -e "$f" ] && { echo "##### $(basename "$f")"; tail -c 200000 "$f"; }; done \
      >"$OUT/gpu_suite_logs.txt" 2>/dev/null
  fi
}

# run_step NAME LIMIT_S: runs this script's function NAME in a child (`gpu_suite.sh --step
# NAME`) under a time limit that also respects the overall deadline; output goes to
# $WORK/NAME.log (its tail to stderr on failure); the outcome is recorded.
run_step() {
  local name=$1 limit=$2
  if [[ " $SKIP " == *" $name "* ]]; then
    printf '%s\t%s\t%s\t%s\n' "$name" "skipped" 0 "SUITE_SKIP" >>"$STEPS"
    return 0
  fi
  local left=$((DEADLINE - (SECONDS - START) - 25))
  if [ "$left" -lt 30 ]; then
    log "step $name skipped: out of time"
    printf '%s\t%s\t%s\t%s\n' "$name" "skipped" 0 "out of time" >>"$STEPS"
    return 0
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  log "step $name (limit ${limit}s)"
  local t0=$SECONDS rc
  timeout --signal=TERM --kill-after=15 "$limit" bash "$SELF" --step "$name" >"$WORK/$name.log" 2>&1
  rc=$?
  local note=""
  [ $rc -eq 124 ] && note="timed out after ${limit}s"
  if [ $rc -ne 0 ]; then
    log "step $name failed (rc $rc) $note; last lines:"
    tail -n 15 "$WORK/$name.log" >&2
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$note" >>"$STEPS"
  write_results
  return $rc
}

# ---------------------------------------------------------------- run

run_step build 330
run_step tests 180
run_step sanitizer 100
run_step bench 330
write_results

python3 - "$RESULT" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("\nleantune GPU suite: %s  %s  %s" % (r["device"], r["date"], r["commit"][:12]))
for name, s in r["steps"].items():
    print("  step %-10s rc=%-8s %4ss  %s" % (name, s["rc"], s["seconds"],
                                             s.get("summary", s.get("note", ""))))
f = r["figures"]
print("\n  %-36s %10s  %s" % ("figure", "value", "target"))
for k in sorted(f):
    if k in ("hbm_copy_tbps", "gemm_bf16_tflops"):
        print("  %-36s %10.3f" % (k, f[k]))
    elif k.endswith("_hbm_fraction"):
        print("  %-36s %10.3f  >= 0.80 %s" % (k, f[k], "ok" if f[k] >= 0.80 else "MISS"))
    elif k.endswith("_vs_best"):
        print("  %-36s %10.3f  >= 0.95 %s" % (k, f[k], "ok" if f[k] >= 0.95 else "MISS"))
    elif k in ("attention_fwd_tflops", "attention_bwd_tflops"):
        t = 350 if "fwd" in k else 250
        print("  %-36s %10.1f  >= %d %s" % (k, f[k], t, "ok" if f[k] >= t else "MISS"))
    elif k.startswith("attention_") and "tflops" in k:
        print("  %-36s %10.1f" % (k, f[k]))
    elif k == "linear_ce_peak_extra_gib_64k":
        print("  %-36s %10.3f  <= 1.00 %s" % (k, f[k], "ok" if f[k] <= 1.0 else "MISS"))
    elif k.startswith("linear_ce_speed_vs_unfused"):
        print("  %-36s %10.3f  >= 1.00 %s" % (k, f[k], "ok" if f[k] >= 1.0 else "MISS"))
    elif k.startswith("linear_ce_") and ("gib" in k or k.endswith("_ms")):
        print("  %-36s %10.3f" % (k, f[k]))
    elif k.startswith("train_") and not k.endswith("_checkpointing"):
        print("  %-36s %10.3f" % (k, f[k]))
if r["errors"]:
    print("\n  errors:")
    for k, v in r["errors"].items():
        print("    %s: %s" % (k, str(v)[:160]))
print("\n  written: %s" % sys.argv[1])
PY
log "logs in $WORK"
exit 0
