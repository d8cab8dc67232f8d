#!/usr/bin/env bash
# CLI tests of `trainer_bin pack` and `trainer_bin lengths`: good runs produce the expected
# files, and every bad input exits 2 with exactly one line on stderr that names the file (and
# the line for per-line problems).
#   cli_data.sh TRAINER_BIN SOURCE_DIR
set -u
bin="$1"
src="$2"
fx="$src/tests/fixtures/datasets"
tok="$src/tests/fixtures/tokenizers/qwen2.5"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_ok NAME CMD...: exit 0.
expect_ok() {
  local name="$1"
  shift
  if ! "$@" >"$tmp/out" 2>"$tmp/err"; then
    fail "$name: exit $? (stderr: $(cat "$tmp/err"))"
    return 1
  fi
  echo "ok: $name"
}

# expect_bad NAME NEEDLE CMD...: exit 2, one stderr line containing NEEDLE.
expect_bad() {
  local name="$1" needle="$2"
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 2 ]; then
    fail "$name: exit $rc, expected 2 (stderr: $(cat "$tmp/err"))"
  elif [ "$lines" -ne 1 ]; then
    fail "$name: $lines stderr lines, expected 1: $(cat "$tmp/err")"
  elif ! grep -qF -- "$needle" "$tmp/err"; then
    fail "$name: stderr lacks '$needle': $(cat "$tmp/err")"
  else
    echo "ok: $name ($(cat "$tmp/err"))"
  fi
}

# ---- pack: good runs
expect_ok pack_bfd "$bin" pack --dataset "$fx/tokenized.jsonl" --max_length 4 \
  --packing_strategy bfd --out "$tmp/bfd.jsonl"
expected='{"input_ids":[1,2,3,4],"seq_lengths":[4]}
{"input_ids":[8,9,10,11],"seq_lengths":[4]}
{"input_ids":[6,7,12],"seq_lengths":[2,1]}'
[ "$(cat "$tmp/bfd.jsonl")" = "$expected" ] || fail "pack_bfd output: $(cat "$tmp/bfd.jsonl")"
grep -q "1 tokens dropped" "$tmp/out" || fail "pack_bfd summary: $(cat "$tmp/out")"

expect_ok pack_bfd_split "$bin" pack --dataset "$fx/tokenized.jsonl" --max_length 4 \
  --packing_strategy bfd_split --out "$tmp/split.jsonl"
expected='{"input_ids":[1,2,3,4],"seq_lengths":[4]}
{"input_ids":[8,9,10,11],"seq_lengths":[4]}
{"input_ids":[6,7,5,12],"seq_lengths":[2,1,1]}'
[ "$(cat "$tmp/split.jsonl")" = "$expected" ] || fail "pack_bfd_split output: $(cat "$tmp/split.jsonl")"

expect_ok pack_wrapped "$bin" pack --dataset "$fx/tokenized.jsonl" --max_length 5 \
  --packing_strategy wrapped --out "$tmp/wrapped.jsonl"
expected='{"input_ids":[1,2,3,4,5]}
{"input_ids":[6,7,8,9,10]}
{"input_ids":[11,12]}'
[ "$(cat "$tmp/wrapped.jsonl")" = "$expected" ] || fail "pack_wrapped output: $(cat "$tmp/wrapped.jsonl")"

expect_ok pack_masked "$bin" pack --dataset "$fx/tokenized_masked.jsonl" --max_length 8 \
  --out "$tmp/masked.jsonl"
expected='{"input_ids":[1,2,3,4,5,6,7,8],"seq_lengths":[5,3],"labels":[-100,-100,3,4,5,-100,7,8]}
{"input_ids":[9,10],"seq_lengths":[2],"labels":[-100,10]}'
[ "$(cat "$tmp/masked.jsonl")" = "$expected" ] || fail "pack_masked output: $(cat "$tmp/masked.jsonl")"

# ---- pack: bad inputs
printf '{"input_ids":[1,2]}\n{"input_ids":[3]}\n{"input_ids":[4,\n' >"$tmp/bad_json.jsonl"
expect_bad pack_invalid_json "bad_json.jsonl:3: invalid JSON" \
  "$bin" pack --dataset "$tmp/bad_json.jsonl" --max_length 4 --out "$tmp/o.jsonl"
[ ! -e "$tmp/o.jsonl" ] || fail "pack_invalid_json left an output file"
printf '{"input_ids":[1,2]}\n{"input_ids":"x"}\n' >"$tmp/bad_type.jsonl"
expect_bad pack_wrong_type "bad_type.jsonl:2: 'input_ids' must be a list" \
  "$bin" pack --dataset "$tmp/bad_type.jsonl" --max_length 4 --out "$tmp/o.jsonl"
printf '{"input_ids":[1,2]}\n{"ids":[1]}\n' >"$tmp/missing.jsonl"
expect_bad pack_missing_key "missing.jsonl:2: missing key 'input_ids'" \
  "$bin" pack --dataset "$tmp/missing.jsonl" --max_length 4 --out "$tmp/o.jsonl"
printf '{"text":"a\xff"}\n' >"$tmp/utf8.jsonl"
expect_bad pack_invalid_utf8 "utf8.jsonl:1: invalid UTF-8" \
  "$bin" pack --dataset "$tmp/utf8.jsonl" --max_length 4 --out "$tmp/o.jsonl"
printf '{"text":"a\\ud800"}\n' >"$tmp/surrogate.jsonl"
expect_bad pack_lone_surrogate "surrogate.jsonl:1: lone surrogate" \
  "$bin" pack --dataset "$tmp/surrogate.jsonl" --max_length 4 --out "$tmp/o.jsonl"
printf '[1,2]\n' >"$tmp/array.jsonl"
expect_bad pack_not_object "array.jsonl:1: expected a JSON object" \
  "$bin" pack --dataset "$tmp/array.jsonl" --max_length 4 --out "$tmp/o.jsonl"
: >"$tmp/empty.jsonl"
expect_bad pack_empty_file "empty.jsonl: no valid example" \
  "$bin" pack --dataset "$tmp/empty.jsonl" --max_length 4 --out "$tmp/o.jsonl"
expect_bad pack_missing_file "nope.jsonl: cannot open dataset" \
  "$bin" pack --dataset "$tmp/nope.jsonl" --max_length 4 --out "$tmp/o.jsonl"
expect_bad pack_text_without_tokenizer "text.jsonl:1: dataset format language_modeling needs a tokenizer" \
  "$bin" pack --dataset "$fx/text.jsonl" --max_length 4 --out "$tmp/o.jsonl"
expect_bad pack_preference_for_sft "preference.jsonl:1: dataset format preference" \
  "$bin" pack --dataset "$fx/preference.jsonl" --tokenizer "$tok" --max_length 4 --out "$tmp/o.jsonl"
expect_bad pack_no_max_length "--max_length" \
  "$bin" pack --dataset "$fx/tokenized.jsonl" --out "$tmp/o.jsonl"
expect_bad pack_zero_max_length "max_length" \
  "$bin" pack --dataset "$fx/tokenized.jsonl" --max_length 0 --out "$tmp/o.jsonl"
expect_bad pack_no_out "--out" \
  "$bin" pack --dataset "$fx/tokenized.jsonl" --max_length 4
expect_bad pack_bad_strategy "first_fit" \
  "$bin" pack --dataset "$fx/tokenized.jsonl" --max_length 4 --packing_strategy first_fit \
  --out "$tmp/o.jsonl"
expect_bad pack_unwritable_out "option --out: folder '$tmp/no_dir' of" \
  "$bin" pack --dataset "$fx/tokenized.jsonl" --max_length 4 --out "$tmp/no_dir/o.jsonl"
expect_bad pack_bad_tokenizer "no_tokenizer" \
  "$bin" pack --dataset "$fx/text.jsonl" --tokenizer "$tmp/no_tokenizer" --max_length 4 \
  --out "$tmp/o.jsonl"

# ---- skip_bad_lines: counted, not fatal
printf '{"input_ids":[1,2]}\n{oops\n{"input_ids":[3]}\n' >"$tmp/skip.jsonl"
expect_ok pack_skip_bad_lines "$bin" pack --dataset "$tmp/skip.jsonl" --max_length 4 \
  --skip_bad_lines --out "$tmp/skip_out.jsonl"
grep -q "1 bad line skipped: invalid_json 1" "$tmp/out" || fail "skip summary: $(cat "$tmp/out")"

# ---- lengths
expect_ok lengths_tokenized "$bin" lengths --dataset "$fx/tokenized.jsonl" --plot "$tmp/h.svg"
for needle in "p50 " "p99 " "histogram:" "recommended max_length:" "bfd_split" "wrapped" \
              "padding_free" "padded" "examples_whole"; do
  grep -qF "$needle" "$tmp/out" || fail "lengths output lacks '$needle'"
done
head -c 4 "$tmp/h.svg" | grep -q "<svg" || fail "lengths --plot did not write an SVG"
expect_bad lengths_bad_line "bad_json.jsonl:3: invalid JSON" \
  "$bin" lengths --dataset "$tmp/bad_json.jsonl"
expect_bad lengths_missing_file "nope.jsonl: cannot open dataset" \
  "$bin" lengths --dataset "$tmp/nope.jsonl"
expect_bad lengths_no_dataset "--dataset" "$bin" lengths
expect_bad lengths_bad_plot "option --plot: folder '$tmp/no_dir' of '$tmp/no_dir/h.svg' does not exist" \
  "$bin" lengths --dataset "$fx/tokenized.jsonl" --plot "$tmp/no_dir/h.svg"
expect_bad lengths_text_without_tokenizer "text.jsonl:1: dataset format language_modeling needs a tokenizer" \
  "$bin" lengths --dataset "$fx/text.jsonl"

# ---- with the real tokenizer (committed fixture)
if [ -f "$tok/tokenizer.json" ]; then
  expect_ok lengths_text "$bin" lengths --dataset "$fx/text.jsonl" --tokenizer "$tok"
  expect_ok lengths_messages "$bin" lengths --dataset "$fx/messages.jsonl" --tokenizer "$tok" \
    --assistant_only_loss
  expect_ok pack_prompt_completion "$bin" pack --dataset "$fx/prompt_completion.jsonl" \
    --tokenizer "$tok" --max_length 64 --out "$tmp/pc.jsonl"
  grep -q '"labels":\[-100' "$tmp/pc.jsonl" || fail "prompt-completion pack lacks masked labels"
  expect_bad pack_assistant_only_on_text "text.jsonl:1: assistant_only_loss=true needs conversational data" \
    "$bin" pack --dataset "$fx/text.jsonl" --tokenizer "$tok" --max_length 64 \
    --assistant_only_loss --out "$tmp/o.jsonl"
  printf '{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}\n{"messages":[{"role":"robot","content":"a"}]}\n' >"$tmp/role.jsonl"
  # Roles are the chat template's business, as in transformers: Qwen2.5's renders only the
  # roles it knows.
  expect_ok pack_unknown_role "$bin" pack --dataset "$tmp/role.jsonl" --tokenizer "$tok" \
    --max_length 64 --out "$tmp/o.jsonl"
else
  echo "skip: no tokenizer fixture at $tok"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all CLI data tests passed"
