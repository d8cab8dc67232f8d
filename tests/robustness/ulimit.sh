#!/usr/bin/env bash
# The demo under an address-space limit (ulimit -v) of 700 MB to 1.3 GB in 100 MB steps: each
# run must end within 30 s with exit 0 (it ran) or 3 (out of memory, one line). Never a hang
# (OpenBLAS retrying a failed buffer allocation forever, engine/host_memory.h), never exit 127
# (a library that cannot be mapped at start-up). In a CUDA build this needs the CUDA libraries
# to be loaded only for --device cuda.
# usage: ulimit.sh TRAINER_BIN
set -u
BIN=$(realpath "$1")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OMP_WAIT_POLICY=PASSIVE
fail=0
for mb in 700 800 900 1000 1100 1200 1300; do
  start=$(date +%s)
  (
    ulimit -v $((mb * 1024))
    exec timeout -k 5 30 "$BIN" sft --max_steps 3 --logging_steps 1 --device cpu \
        --output_dir "$T/out$mb"
  ) >"$T/log$mb" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  last=$(grep '^trainer_bin:' "$T/log$mb" | tail -1)
  if [ $rc -eq 0 ] || { [ $rc -eq 3 ] && [ -n "$last" ]; }; then
    echo "ok ($mb MB): exit $rc in ${secs}s ${last}"
  else
    echo "FAIL ($mb MB): exit $rc in ${secs}s (124/137: a hang, 127: could not start)"
    tail -3 "$T/log$mb"
    fail=1
  fi
done
exit $fail
