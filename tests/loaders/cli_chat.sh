#!/usr/bin/env bash
# CLI tests of chat templates through `trainer_bin tokenize --chat` and `trainer_bin pack` (the
# data path sft uses): SmolLM2's real template (with its default system prompt) gives
# transformers' ids, a TRL dataset row with tools gives transformers' ids, and bad templates or
# options exit 2 with one stderr line naming the template file, line and column.
# Expected ids come from tests/fixtures/gen_chat_template_fixtures.py (chat_templates/cli/).
#   cli_chat.sh TRAINER_BIN SOURCE_DIR
set -u
bin="$1"
src="$2"
cli="$src/tests/fixtures/chat_templates/cli"
smol_tok="$src/tests/fixtures/tokenizers/smollm2"
smol_tmpl="$src/tests/fixtures/chat_templates/smollm2.jinja"
qwen_tok="$src/tests/fixtures/tokenizers/qwen2.5"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_stdout NAME EXPECTED_FILE CMD...: exit 0 and stdout equal to the file.
expect_stdout() {
  local name="$1" want="$2"
  shift 2
  if ! "$@" >"$tmp/out" 2>"$tmp/err"; then
    fail "$name: exit $? (stderr: $(cat "$tmp/err"))"
  elif ! cmp -s "$tmp/out" "$want"; then
    fail "$name: stdout $(head -c 300 "$tmp/out") != $(head -c 300 "$want")"
  else
    echo "ok: $name"
  fi
}

# expect_bad NAME REGEX CMD...: exit 2, one stderr line matching REGEX (grep -E).
expect_bad() {
  local name="$1" regex="$2"
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 2 ]; then
    fail "$name: exit $rc, expected 2 (stderr: $(cat "$tmp/err"))"
  elif [ "$lines" -ne 1 ]; then
    fail "$name: $lines stderr lines, expected 1: $(cat "$tmp/err")"
  elif ! grep -qE -- "$regex" "$tmp/err"; then
    fail "$name: stderr does not match '$regex': $(cat "$tmp/err")"
  else
    echo "ok: $name ($(cat "$tmp/err"))"
  fi
}

# ---- tokenize --chat: ids as transformers' apply_chat_template(tokenize=True)
expect_stdout smollm2_default_system "$cli/smollm2_user_only_gen.ids" \
  "$bin" tokenize --tokenizer "$smol_tok" --chat_template "$smol_tmpl" --chat \
  --add_generation_prompt --file "$cli/smollm2_user_only.json"
expect_stdout smollm2_multi_turn "$cli/smollm2_multi_turn.ids" \
  "$bin" tokenize --tokenizer "$smol_tok" --chat_template "$smol_tmpl" --chat \
  --file "$cli/smollm2_multi_turn.json"
expect_stdout qwen_tools_row "$cli/qwen2.5_tools.ids" \
  "$bin" tokenize --tokenizer "$qwen_tok" --chat --file "$cli/qwen2.5_tools.row.json"

# ---- pack (sft's data path): the tokenized conversation is transformers' ids. The fixture
# folder holds only tokenizer.json; SmolLM2's tokenizer_config.json gives its special tokens.
mkdir -p "$tmp/smollm2"
cp "$smol_tok/tokenizer.json" "$tmp/smollm2/"
printf '{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>"}\n' \
  >"$tmp/smollm2/tokenizer_config.json"
if "$bin" pack --dataset "$cli/smollm2_multi_turn.jsonl" --tokenizer "$tmp/smollm2" \
  --chat_template "$smol_tmpl" --max_length 4096 --out "$tmp/packed.jsonl" 2>"$tmp/err"; then
  got=$(grep -o '"input_ids":\[[^]]*\]' "$tmp/packed.jsonl" | sed 's/"input_ids"://')
  if [ "$got" = "$(cat "$cli/smollm2_multi_turn.ids")" ]; then
    echo "ok: pack_smollm2_ids"
  else
    fail "pack_smollm2_ids: $got"
  fi
else
  fail "pack_smollm2_ids: exit (stderr: $(cat "$tmp/err"))"
fi

# ---- bad templates and options: exit 2, one line with file:line:col
printf 'hello\n{{ messages | frobnicate }}\n' >"$tmp/unknown_filter.jinja"
printf '{%% for m in messages %%}{{ m.content }}' >"$tmp/unclosed.jinja"
printf '\n  {{ raise_exception("system role not supported") }}' >"$tmp/raise.jinja"
msgs='[{"role": "user", "content": "hi"}]'
expect_bad unknown_filter "unknown_filter\.jinja:2:15: unknown filter 'frobnicate'" \
  "$bin" tokenize --tokenizer "$qwen_tok" --chat --chat_template "$tmp/unknown_filter.jinja" --text "$msgs"
expect_bad unclosed_for "unclosed\.jinja:1:4: unclosed 'for' block" \
  "$bin" tokenize --tokenizer "$qwen_tok" --chat --chat_template "$tmp/unclosed.jinja" --text "$msgs"
expect_bad raise_exception "raise\.jinja:2:6: raise_exception: system role not supported" \
  "$bin" tokenize --tokenizer "$qwen_tok" --chat --chat_template "$tmp/raise.jinja" --text "$msgs"
expect_bad unknown_name "unknown chat template 'vicuna'" \
  "$bin" tokenize --tokenizer "$qwen_tok" --chat --chat_template vicuna --text "$msgs"
expect_bad bad_kwargs "chat_template_kwargs" \
  "$bin" tokenize --tokenizer "$qwen_tok" --chat --chat_template_kwargs '[1]' --text "$msgs"
expect_bad no_mask "assistant_only_loss needs the chat template" \
  "$bin" tokenize --tokenizer "$qwen_tok" --chat --assistant_mask \
  --chat_template "$src/tests/fixtures/chat_templates/deepseek_r1_distill_qwen.jinja" --text "$msgs"
expect_bad pack_no_mask "assistant_only_loss needs the chat template" \
  "$bin" pack --dataset "$cli/smollm2_multi_turn.jsonl" --tokenizer "$qwen_tok" \
  --chat_template "$src/tests/fixtures/chat_templates/deepseek_r1_distill_qwen.jinja" \
  --assistant_only_loss --max_length 4096 --out "$tmp/o.jsonl"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
