#!/usr/bin/env bash
# `trainer_bin inspect` end to end: exit 0 and the tensor listing on good input, exit 2 and one
# stderr line naming the file on bad input.
#   usage: inspect_cli.sh TRAINER_BIN SOURCE_DIR WORK_DIR
set -u
bin=$1
src=$2
work=$3
corpus=$src/tests/fuzz/corpus/safetensors
rm -rf "$work" && mkdir -p "$work"
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run NAME ARGS...: captures exit code, stdout and stderr of trainer_bin.
run() {
  local name=$1
  shift
  "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  out=$(cat "$work/$name.out")
  err=$(cat "$work/$name.err")
}

expect_rc() {
  [[ $rc -eq $1 ]] || fail "$2: exit code $rc, expected $1 (stderr: $err)"
}

expect_out() {
  grep -qF -- "$1" "$work/$2.out" || fail "$2: stdout lacks '$1'"
}

# One line on stderr that names the given text.
expect_one_error_line() {
  local lines
  lines=$(wc -l <"$work/$2.err")
  [[ $lines -eq 1 ]] || fail "$2: $lines lines on stderr, expected 1: $err"
  grep -qF -- "$1" "$work/$2.err" || fail "$2: stderr does not name '$1': $err"
}

# A good file: names, dtypes, shapes and totals.
good=$corpus/good_metadata_and_tensors
run good inspect "$good"
expect_rc 0 good
for text in "w  " "b  " "m  " "F64" "BF16" "BOOL" "[3]" "format = pt" "parameters: 7" "bytes: 24"; do
  expect_out "$text" good
done

# Bad files: exit 2, one line naming the file and the problem.
for name in bad_duplicate_tensor bad_offsets_gap bad_empty_file bad_invalid_utf8; do
  run "$name" inspect "$corpus/$name"
  expect_rc 2 "$name"
  expect_one_error_line "$corpus/$name" "$name"
done
grep -qF "duplicate key 'a'" "$work/bad_duplicate_tensor.err" || fail "duplicate not named"

# A model folder: weights plus config summary.
model=$work/model
mkdir -p "$model"
cp "$corpus/good_one_f32" "$model/model.safetensors"
cp "$src/tests/fixtures/configs/qwen2.5-0.5b.json" "$model/config.json"
run folder inspect "$model"
expect_rc 0 folder
expect_out "Qwen2ForCausalLM" folder
expect_out "494032768 parameters" folder
expect_out "config parameter count differs from the tensors" folder

# A config alone.
run config inspect "$src/tests/fixtures/configs/llama3.2-1b.json"
expect_rc 0 config
expect_out "llama3 scaling" config

# A bad config: exit 2 naming file and key.
echo '{"architectures": ["LlamaForCausalLM"], "hidden_size": 8}' >"$work/bad_config.json"
run bad_config inspect "$work/bad_config.json"
expect_rc 2 bad_config
expect_one_error_line "intermediate_size" bad_config

# Usage errors and help.
run missing inspect "$work/does_not_exist.safetensors"
expect_rc 2 missing
expect_one_error_line "does_not_exist.safetensors" missing
run noargs inspect
expect_rc 2 noargs
run help inspect --help
expect_rc 0 help
expect_out "path" help

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "inspect CLI: all checks passed"
