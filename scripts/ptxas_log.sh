#!/usr/bin/env bash
# CUDA compiler launcher that records ptxas's resource report (-Xptxas=-v) per object file.
#   ptxas_log.sh <dir> <compiler command...>
# Runs the command (itself possibly behind ccache, which replays stderr on a hit), passes every
# line except ptxas's "info" report through to stderr, and writes <dir>/<object>.tsv with one
# row per kernel and architecture:
#   arch  kernel(mangled)  registers  stack_bytes  spill_store_bytes  spill_load_bytes  smem_bytes
# (smem is static shared memory; dynamic shared memory is declared by the launchers).
# tests/kernels/test_kernel_resources.cpp reads these files.
set -u
dir="$1"
shift
obj=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && obj="$a"
  prev="$a"
done
err=$(mktemp)
"$@" 2>"$err"
rc=$?
grep -v '^ptxas info\|^    [0-9]* bytes stack frame' "$err" >&2
if [ -n "$obj" ] && grep -q "^ptxas info    : Compiling entry function" "$err"; then
  mkdir -p "$dir"
  name=$(printf '%s' "$obj" | sed 's|^\./||; s|[/ ]|_|g')
  awk '
    /Compiling entry function/ {
      match($0, /function .[^'"'"']*/); fn = substr($0, RSTART + 10, RLENGTH - 10)
      match($0, /for .sm_[0-9a-z]*/); arch = substr($0, RSTART + 5, RLENGTH - 5)
      stack = 0; sst = 0; sld = 0; next
    }
    /bytes stack frame/ { stack = $1; sst = $5; sld = $9; next }
    /: Used [0-9]+ registers/ && fn != "" {
      match($0, /Used [0-9]+/); regs = substr($0, RSTART + 5, RLENGTH - 5)
      smem = 0
      if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
      printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", arch, fn, regs, stack, sst, sld, smem
      fn = ""
    }' "$err" >"$dir/$name.tsv.tmp" && mv "$dir/$name.tsv.tmp" "$dir/$name.tsv"
fi
rm -f "$err"
exit $rc
