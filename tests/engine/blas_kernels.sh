#!/usr/bin/env bash
# trainer_bin's choice of OpenBLAS kernels (engine/blas_kernels.h), end to end. The expected
# family comes from this script's own reading of /proc/cpuinfo, not from leantune's table.
#   cli BIN SRC           the demo with no variable set runs this CPU's best family; a simulated
#                         generic detection (OPENBLAS_CORETYPE=Prescott with
#                         LEANTUNE_BLAS_SIMULATE_DETECTED=Prescott) is replaced by the best family
#                         and self-checked; a simulated self-check mismatch falls back to Prescott;
#                         the user's variable is respected; losses are the same with every choice;
#                         exit codes and SIGTERM survive the restart
#   mpi BIN SRC MPIRUN    the same simulated detection on 2 ranks: each rank restarts before
#                         MPI_Init and runs the best family
#   family FAMILY (TEST FILTER)...
#                         each gtest binary TEST with --gtest_filter=FILTER, under
#                         OPENBLAS_CORETYPE=FAMILY; exit 77 (skipped) when this CPU cannot run
#                         FAMILY
set -u
MODE=$1
shift
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
vendor=$(grep -m1 '^vendor_id' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
has() { local x; for x in "$@"; do [[ "$flags" == *" $x "* ]] || return 1; done; }
runs() {
  case $1 in
    Cooperlake) has avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 ;;
    SkylakeX) has avx512f avx512dq avx512cd avx512bw avx512vl ;;
    Zen) [[ $vendor == AuthenticAMD || $vendor == HygonGenuine ]] && has avx2 fma ;;
    Haswell) has avx2 fma ;;
    Sandybridge) has avx ;;
    Prescott) has pni ;;
    *) return 1 ;;
  esac
}
best=""
for f in Cooperlake SkylakeX Zen Haswell Sandybridge; do
  if runs $f; then best=$f; break; fi
done

if [ "$MODE" = family ]; then
  fam=$1
  shift
  runs "$fam" || { echo "SKIPPED: this CPU cannot run the $fam kernels"; exit 77; }
  status=0
  while [ $# -ge 2 ]; do
    OPENBLAS_CORETYPE=$fam "$1" --gtest_filter="$2" || status=1
    shift 2
  done
  exit $status
fi

BIN=$(realpath "$1")
SRC=$(realpath "$2")
[ -n "$best" ] ||
  { echo "SKIPPED: this CPU runs nothing better than the generic kernels"; exit 77; }
T=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1
fail=0
bad() { echo "FAIL: $*"; fail=1; }
SIM="OPENBLAS_CORETYPE=Prescott LEANTUNE_BLAS_SIMULATE_DETECTED=Prescott"
SIMULATED="simulated by LEANTUNE_BLAS_SIMULATE_DETECTED"
CHOSEN="$best kernels (chosen by leantune, self-checked; the library detected Prescott, $SIMULATED)"

# demo NAME ENV...: 3 logged steps of the demo in $T/NAME (stdout in out, stderr in err).
demo() {
  local name=$1
  shift
  (cd "$T" && env "$@" "$BIN" sft --max_steps 3 --logging_steps 1 --output_dir "$name" \
     >"$name.out" 2>"$name.err")
}
# expect NAME TEXT: the run header and the memory report both carry TEXT.
expect() {
  local n
  n=$(grep -cF -- "$2" "$T/$1.out")
  [ "$n" -eq 2 ] || { bad "$1: '$2' in $n lines, expected the header and the memory report"; \
                      sed 's/^/    /' "$T/$1.out" "$T/$1.err" | grep -E "BLAS|trainer_bin" ; }
}
losses() { grep -o '"loss":[-0-9.e+]*' "$T/$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }

if [ "$MODE" = cli ]; then
  demo default A=1 || bad "default run exit $?"
  if ! grep -q "BLAS: OpenBLAS [0-9.]*, $best kernels (" "$T/default.out"; then
    # A family of the same tier is the library's to keep (Haswell on an AMD CPU: Zen's tier).
    [ "$best" = Zen ] && grep -q "Haswell kernels (the library's choice)" "$T/default.out" ||
      bad "default run does not use the $best kernels: $(grep -m1 BLAS: "$T/default.out")"
  fi
  demo chosen $SIM || bad "simulated detection: exit $?"
  expect chosen "$CHOSEN"
  demo mismatch $SIM LEANTUNE_BLAS_SIMULATE_MISMATCH=1 || bad "simulated mismatch: exit $?"
  expect mismatch "Prescott kernels (the library's choice, $SIMULATED; leantune's $best kernels \
failed the self-check and are not used: sgemm 61x47x83 A B^T: C[30,23] is "
  demo user OPENBLAS_CORETYPE=Prescott || bad "user's variable: exit $?"
  expect user "Prescott kernels (set by OPENBLAS_CORETYPE)"
  demo kept $SIM LEANTUNE_BLAS_CORETYPE=library || bad "LEANTUNE_BLAS_CORETYPE=library: exit $?"
  expect kept "Prescott kernels (the library's choice, $SIMULATED; this CPU runs $best kernels, \
faster: set OPENBLAS_CORETYPE=$best)"
  # Losses: every choice within the fixtures' tolerance (1e-4 relative) of the default run.
  ref=$(losses default)
  [ "$(echo "$ref" | wc -w)" -eq 3 ] || bad "default run logged '$ref', expected 3 losses"
  for run in chosen mismatch user kept; do
    got=$(losses $run)
    awk -v a="$ref" -v b="$got" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
      if (n != m) exit 1; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d;
      if (d > 1e-4 * x[i]) exit 1 } }' || bad "$run: losses $got differ from $ref"
  done
  # Exit codes survive the restart: a bad option is still exit 2 in one line, and a bad
  # variable is refused before anything runs.
  (cd "$T" && env $SIM "$BIN" sft --no_such_option 1 >/dev/null 2>"$T/opt.err")
  rc=$?
  [ "$rc" -eq 2 ] && [ "$(grep -c '^trainer_bin:' "$T/opt.err")" -eq 1 ] ||
    bad "bad option after the restart: exit $rc, $(cat "$T/opt.err")"
  (cd "$T" && LEANTUNE_BLAS_CORETYPE=Icelake "$BIN" sft >/dev/null 2>"$T/var.err")
  rc=$?
  [ "$rc" -eq 2 ] &&
    grep -q "^trainer_bin: LEANTUNE_BLAS_CORETYPE=Icelake is not auto, library" "$T/var.err" ||
    bad "LEANTUNE_BLAS_CORETYPE=Icelake: exit $rc, $(cat "$T/var.err")"
  # SIGTERM reaches the restarted process (the same pid): it saves a checkpoint and exits 0.
  env $SIM "$BIN" sft --max_steps 100000 --logging_steps 1 --save_steps 0 \
    --output_dir "$T/term" >"$T/term.out" 2>"$T/term.err" &
  pid=$!
  for _ in $(seq 100); do [ -s "$T/term/metrics.jsonl" ] && break; sleep 0.2; done
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  [ "$rc" -eq 0 ] && grep -q "stopped at step" "$T/term.out" && grep -qF "$CHOSEN" "$T/term.out" ||
    bad "SIGTERM after the restart: exit $rc; $(tail -n 2 "$T/term.out" "$T/term.err")"
fi

if [ "$MODE" = mpi ]; then
  MPIRUN=$3
  (cd "$T" && timeout 300 "$MPIRUN" --oversubscribe --allow-run-as-root -np 2 \
     -x OPENBLAS_CORETYPE=Prescott -x LEANTUNE_BLAS_SIMULATE_DETECTED=Prescott \
     "$BIN" sft --max_steps 2 --output_dir mpi >"$T/mpi.out" 2>"$T/mpi.err")
  rc=$?
  n=$(grep -cF "$CHOSEN" "$T/mpi.out")
  [ "$rc" -eq 0 ] && [ "$n" -eq 4 ] ||
    bad "2 ranks: exit $rc, $n lines name the chosen kernels (2 headers and 2 reports expected);" \
        "$(tail -n 3 "$T/mpi.err")"
fi

[ "$fail" -eq 0 ] && echo "ok: $best kernels"
exit $fail
