#!/bin/bash
# A rank that stops answering (stuck) or dies (killed) must end a 3-rank job non-zero within
# seconds, with a message naming rank 1. Usage: comm_failure.sh stuck|killed MPIRUN PROGRAM
set -u
mode=$1 mpirun=$2 prog=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout 100 "$mpirun" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 \
  -np 3 "$prog" "$mode" >"$out" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$out"
rm -f "$out.keep"
fail() { echo "FAIL: $*"; rm -f "$out"; exit 1; }
[ $rc -ne 0 ] || fail "mpirun exited 0"
[ $rc -ne 124 ] || fail "the job hung (killed by timeout after 100 s)"
[ $elapsed -lt 60 ] || fail "took ${elapsed} s"
if [ "$mode" = stuck ]; then
  grep -q "rank 1 lost" "$out" || fail "no message naming rank 1 as lost"
else
  grep -Eqi "rank 1|rank: 1" "$out" || fail "no message naming rank 1"
fi
echo "ok: exit $rc after ${elapsed} s"
rm -f "$out"
