#!/usr/bin/env bash
# The installed package end to end: `cmake --install` into a temporary prefix, then the
# out-of-tree project in examples/ configured with find_package(leantune) against that prefix,
# built and run for a few steps (finetune_demo, and hpc_pipeline as one rank when MPI is found);
# finetune_demo built once more with pkg-config's flags.
#   install_example.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) version=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install_example: $*" >&2; exit 1; }
unset LEANTUNE_DATA_DIR  # the installed demo data must be found beside the installed library

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
p=$tmp/prefix
# The public API is the only installed header; the library carries its ABI major in its name.
[ "$(cd "$p/include" && find . -type f)" = "./leantune/leantune.h" ] || fail "installed headers: $(cd "$p/include" && find . -type f | tr '\n' ' ')"
major=${version%%.*}
[ -f "$p/lib/libleantune.so.$version" ] || fail "no lib/libleantune.so.$version"
[ "$(readlink "$p/lib/libleantune.so.$major")" = "libleantune.so.$version" ] || fail "no soname link"
# Outputs are captured before grep -q reads them: grep -q stops at the first match, and under
# pipefail the writer's SIGPIPE would fail the pipeline (ldd lists many libraries with MPI).
dyn=$(readelf -d "$p/lib/libleantune.so.$version")
grep -q "SONAME.*\[libleantune.so.$major\]" <<<"$dyn" || fail "soname"
[ -f "$p/share/leantune/embedded/config.json" ] || fail "no embedded demo data"

cmake -S "$src/examples" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release \
  >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configure failed"; }
cmake --build "$tmp/build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build failed"; }
cd "$tmp"
out=$("$tmp/build/finetune_demo" 3 "$tmp/out" 2>/dev/null) || fail "finetune_demo exited $?"
echo "$out"
echo "$out" | grep -q "^leantune $version: 3 steps, loss" || fail "unexpected output"
echo "$out" | grep -q "^step 3/3 loss" || fail "the step callback did not run"
[ -f "$tmp/out/model.safetensors" ] || fail "no model written"
# With MPI: the pipeline example (its own communicator, log sink, signal handler, rows in memory)
# as one rank; its log lines come through its sink.
if [ -x "$tmp/build/hpc_pipeline" ]; then
  hpc=$("$tmp/build/hpc_pipeline" 2 "$tmp/hpc" 2>&1) || fail "hpc_pipeline exited $?: $hpc"
  echo "$hpc"
  grep -q "^\[run 0 info\] dataset_rows: 32 examples" <<<"$hpc" || fail "hpc_pipeline: no log line"
  grep -q "^run 0: 2 steps, loss" <<<"$hpc" || fail "hpc_pipeline: unexpected output"
  [ -f "$tmp/hpc/run0/model.safetensors" ] || fail "hpc_pipeline: no model written"
fi
# The library that ran is the installed one.
libs=$(ldd "$tmp/build/finetune_demo")
grep -q "$p/lib/libleantune.so.$major" <<<"$libs" || fail "not linked to the prefix"

export PKG_CONFIG_PATH=$p/lib/pkgconfig
[ "$(pkg-config --modversion leantune)" = "$version" ] || fail "pkg-config version"
# shellcheck disable=SC2046
g++ -std=c++17 "$src/examples/finetune_demo.cpp" $(pkg-config --cflags --libs leantune) \
  -o "$tmp/demo_pc" || fail "pkg-config build failed"
pc_out=$("$tmp/demo_pc" 1 "$tmp/out_pc" 2>/dev/null) || fail "pkg-config build exited $?"
grep -q "^leantune $version: 1 steps" <<<"$pc_out" || fail "pkg-config build run"
echo "install_example: ok"
