#!/bin/bash
# Two independent trainings at once in one MPI job, each over its own half of MPI_COMM_WORLD
# (TrainerSetup::communicator), against a plain 2-rank run over MPI_COMM_WORLD: under
# --deterministic_comm each half's losses equal the plain run's bit for bit (a half that trained
# over 1 or 4 ranks, or whose traffic mixed with the other's, would differ or hang).
#   api_mpi.sh PROGRAM MPIRUN
set -euo pipefail
prog=$1 mpirun=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "api_mpi: $*" >&2; exit 1; }
run=("$mpirun" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
"${run[@]}" -np 2 "$prog" world "$tmp" || fail "the plain 2-rank run failed"
"${run[@]}" -np 4 "$prog" halves "$tmp" || fail "the split run failed"
[ "$(wc -l <"$tmp/losses")" = 3 ] || fail "expected 3 losses, got: $(cat "$tmp/losses")"
for h in 0 1; do
  cmp "$tmp/losses" "$tmp/losses_half$h" ||
    fail "half $h: $(tr '\n' ' ' <"$tmp/losses_half$h") vs plain $(tr '\n' ' ' <"$tmp/losses")"
done
echo "api_mpi: both halves equal the plain 2-rank run: $(tr '\n' ' ' <"$tmp/losses")"
