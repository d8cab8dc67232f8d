#!/usr/bin/env bash
# CLI side of the lazily loaded CUDA backend (engine/cuda_backend.h):
#   - trainer_bin and libleantune link no CUDA library;
#   - a CPU run never loads libleantune_cuda, and start-up fits in a small address space;
#   - --device cuda with a backend that cannot be loaded exits 2 with one line saying why.
# usage: cuda_backend.sh TRAINER_BIN SOURCE_DIR [sanitize]  (sanitizers reserve terabytes of
# address space, so the ulimit check is left out there)
set -u
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

if ldd "$bin" | grep -E 'libcuda|libcudart|libcublas|libnccl'; then
  echo "FAIL: trainer_bin depends on a CUDA library at load time"
  fail=1
else
  echo "ok: trainer_bin links no CUDA library"
fi

# Linked CUDA libraries alone need several hundred MB of address space at start-up.
if [ "${3:-}" = sanitize ]; then
  echo "skipped: ulimit check under sanitizers"
elif (ulimit -v 400000 && "$bin" --help >/dev/null 2>"$tmp/err"); then
  echo "ok: starts under ulimit -v 400000"
else
  echo "FAIL: trainer_bin --help under ulimit -v 400000: $(cat "$tmp/err")"
  fail=1
fi

LD_DEBUG=files "$bin" sft --device cpu --max_steps 1 \
  --output_dir "$tmp/run" >/dev/null 2>"$tmp/ld"
rc=$?
if [ "$rc" -ne 0 ] || grep -q 'libleantune_cuda\|libcudart' "$tmp/ld"; then
  echo "FAIL: a --device cpu run (exit $rc) loaded the CUDA backend:"
  grep 'libleantune_cuda\|libcudart' "$tmp/ld" | head -3
  fail=1
else
  echo "ok: a --device cpu run does not load the CUDA backend"
fi

LEANTUNE_CUDA_LIBRARY=$tmp/missing/libleantune_cuda.so "$bin" sft --device cuda --max_steps 1 \
  --output_dir "$tmp/run2" >/dev/null 2>"$tmp/err"
rc=$?
lines=$(wc -l <"$tmp/err")
if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] &&
  grep -q 'cuda:0 is not available (0 CUDA devices: .*\(missing/libleantune_cuda.so\|no CUDA backend\)' "$tmp/err"; then
  echo "ok: $(cat "$tmp/err")"
else
  echo "FAIL: --device cuda without a loadable backend: exit $rc, $lines lines:"
  cat "$tmp/err"
  fail=1
fi
exit $fail
