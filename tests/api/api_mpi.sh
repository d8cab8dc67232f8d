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
# sft (its data loader shards over the communicator as it is built) and dpo (its row batches
# shard over the trainer's communicator, handed over after the run is built).
for algo in sft dpo; do
  out=$tmp/$algo
  mkdir -p "$out"
  "${run[@]}" -np 2 "$prog" world "$out" "$algo" || fail "$algo: the plain 2-rank run failed"
  "${run[@]}" -np 4 "$prog" halves "$out" "$algo" || fail "$algo: the split run failed"
  [ "$(wc -l <"$out/losses")" = 3 ] || fail "$algo: expected 3 losses, got: $(cat "$out/losses")"
  for h in 0 1; do
    cmp "$out/losses" "$out/losses_half$h" ||
      fail "$algo half $h: $(tr '\n' ' ' <"$out/losses_half$h") vs plain $(tr '\n' ' ' <"$out/losses")"
  done
  echo "api_mpi: $algo: both halves equal the plain 2-rank run: $(tr '\n' ' ' <"$out/losses")"
done
