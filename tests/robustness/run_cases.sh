#!/usr/bin/env bash
# The robustness suite: trainer_bin over a table of bad inputs, faults and signals (cases.tsv).
# Each row: name, setup, expected exit code, a fragment of the expected message, arguments.
#   setup    a function below that prepares the case's folder $W ('-' for none); it may print
#            SKIP: <reason> to skip the row (e.g. a read-only mount needs root)
#   exit     the expected exit code
#   fragment text the last line on stderr must contain (stdout for exit 0)
#   args     trainer_bin's arguments, expanded by the shell: $MODEL (a tiny model), $DATA (a small
#            dataset), $CKPT (an output_dir holding checkpoint-1 and checkpoint-2 of $TRAIN), $W
#            (this case's folder), $SRC; '@TERM<seconds> ' first sends SIGTERM that long after the
#            start (each further '@TERM<seconds> ' one more, that long after the previous step);
#            '@WAIT<path> ' before them waits (up to 60 s) until $W/<path> is a non-empty file;
#            '@ULIMIT_F<blocks> ' first sets ulimit -f; '@ENV<NAME>=<value> ' sets an environment
#            variable for the run.
# A failing run must print exactly one error line ("trainer_bin: ..."). After the run, a
# function named check_<name> (when defined) checks files. Add a row for each future bug.
# Exit 0 rows look for the fragment anywhere in stdout and stderr.
# No process started by a row may outlive trainer_bin: every run carries a marker in its
# environment, and a process that still carries it after the run fails the row.
# TABLE (default cases.tsv) is a table in this folder; a file of the same name ending in .sh
# beside it, when present, is sourced for that table's own setups and checks.
# usage: run_cases.sh TRAINER_BIN SOURCE_DIR [TABLE] [NAME_FILTER]
set -u
BIN=$(realpath "$1")
SRC=$(realpath "$2")
TABLE=${3:-cases.tsv}
FILTER=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$HERE/$TABLE" ] || { echo "FAIL: no table $HERE/$TABLE"; exit 1; }
T=$(mktemp -d)
MOUNTS=()
cleanup() {
  for m in "${MOUNTS[@]+"${MOUNTS[@]}"}"; do umount "$m" 2>/dev/null; done
  chmod -R u+w "$T" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1

DATA=$SRC/tests/fixtures/trainer/stories_small.jsonl
MODEL=$T/model
CKPT=$T/ckpt
# The options of every run that resumes $CKPT (the same data order, batch and seed).
TRAIN="--model_name_or_path $MODEL --dataset $DATA --max_length 64 --per_device_train_batch_size 2 --device cpu --logging_steps 1"

"$BIN" init-model --config "$SRC/data/embedded/config.json" --out "$MODEL" \
    --tokenizer "$SRC/data/embedded" >/dev/null || { echo "FAIL: init-model"; exit 1; }
# shellcheck disable=SC2086
"$BIN" sft $TRAIN --output_dir "$CKPT" --max_steps 3 --save_steps 1 >"$T/ckpt.log" 2>&1 ||
  { echo "FAIL: making the checkpoints"; cat "$T/ckpt.log"; exit 1; }
[ -f "$CKPT/checkpoint-2/leantune_state.json" ] || { echo "FAIL: no checkpoint-2"; exit 1; }

# ---- setups: run in the case's folder $W ----
copy_ckpt() { cp -r "$CKPT" "$W/out"; }
file_at_out() { echo x >"$W/afile"; }
readonly_dir() {
  mkdir -p "$W/ro"
  if [ "$(id -u)" -ne 0 ]; then
    chmod 555 "$W/ro"
  elif mount -t tmpfs -o ro,size=64k tmpfs "$W/ro" 2>/dev/null; then
    MOUNTS+=("$W/ro")
  else
    echo "SKIP: root cannot be denied a write without a read-only mount, and mount failed"
  fi
}
state_empty() { copy_ckpt; echo '{}' >"$W/out/checkpoint-2/leantune_state.json"; }
state_string_step() {
  copy_ckpt
  sed -i 's/"global_step": *2/"global_step": "two"/' "$W/out/checkpoint-2/leantune_state.json"
}
state_bad_data_state() {
  copy_ckpt
  sed -i 's/"epoch": *0,/"epoch": "zero",/' "$W/out/checkpoint-2/leantune_state.json"
}
state_bad_best() {
  copy_ckpt
  sed -i 's/"best": *null/"best": "x"/' "$W/out/checkpoint-2/leantune_state.json"
}
state_bad_log_history() {
  copy_ckpt
  sed -i 's/"log_history": *\[/"log_history": 7, "x": [/' "$W/out/checkpoint-2/trainer_state.json"
}
fewer_layers() {
  cp -r "$MODEL" "$W/m"
  sed -i 's/"num_hidden_layers": *4/"num_hidden_layers": 3/' "$W/m/config.json"
}
# model.bogus.weight in a second shard, listed beside every real tensor in an index.
bogus_tensor() {
  mkdir -p "$W/m"
  cp "$MODEL"/*.json "$W/m/"
  cp "$MODEL/model.safetensors" "$W/m/a.safetensors"
  local header='{"model.bogus.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
  { printf "\\x$(printf %02x ${#header})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"; printf '%s' "$header"
    printf '\x00\x00\x80\x3f'; } >"$W/m/b.safetensors"
  {
    printf '{"metadata": {}, "weight_map": {"model.bogus.weight": "b.safetensors"'
    "$BIN" inspect "$MODEL" | awk '$1 ~ /^(model|lm_head)\./ {printf ", \"%s\": \"a.safetensors\"", $1}'
    printf '}}\n'
  } >"$W/m/model.safetensors.index.json"
}
cfg() { printf '%s\n' "$1" >"$W/c.json"; }
cfg_u64max() { cfg '{"max_steps": 18446744073709551615}'; }
cfg_2pow63() { cfg '{"max_steps": 9223372036854775808}'; }
cfg_1e30() { cfg '{"max_steps": 1e30}'; }
cfg_batch_u64max() { cfg '{"per_device_train_batch_size": 18446744073709551615}'; }
cfg_fraction() { cfg '{"max_steps": 2.5}'; }
cfg_duplicate() { cfg '{"max_steps": 2, "learning_rate": 1e-3, "max_steps": 3}'; }
stale_tmp() {
  copy_ckpt
  mkdir -p "$W/out/.checkpoint-3.tmp-99999"
  head -c 100000 /dev/zero >"$W/out/.checkpoint-3.tmp-99999/model.safetensors"
}
old_only() { copy_ckpt; mv "$W/out/checkpoint-2" "$W/out/.checkpoint-2.old-99999"; }
tokenizer_dir() {
  cp -r "$MODEL" "$W/m"
  rm "$W/m/tokenizer.json"
  mkdir "$W/m/tokenizer.json"
}
model_only_ckpt() {  # a checkpoint written with --save_only_model
  # shellcheck disable=SC2086
  "$BIN" sft $TRAIN --output_dir "$W/out" --max_steps 3 --save_steps 1 --save_only_model \
    >"$W/ckpt.log" 2>&1
}
foreign_tokenizer() {  # the tiny model with Qwen2.5's tokenizer (151k tokens for its 576)
  cp -r "$MODEL" "$W/m"
  cp "$SRC"/tests/fixtures/tokenizers/qwen2.5/tokenizer*.json "$W/m/"
}
vocab_huge() {
  sed 's/"vocab_size": *576/"vocab_size": 1000000000000/' "$SRC/data/embedded/config.json" \
    >"$W/config.json"
}
out_dir() { mkdir -p "$W/packed"; }
number_overflow() { printf '{"text": 1E777}\n' >"$W/d.jsonl"; }
# DPO: preference rows with a missing field, and an implicit-prompt pair whose prompts differ.
pref_no_chosen() {
  printf '%s\n' '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog."}' \
    '{"prompt": "One day,", "rejected": " a dog."}' >"$W/p.jsonl"
}
unpaired_no_label() {
  printf '%s\n' '{"prompt": "One day,", "completion": " a cat.", "label": true}' \
    '{"prompt": "One day,", "completion": " a dog."}' >"$W/u.jsonl"
}
unpaired_label_text() {
  printf '%s\n' '{"prompt": "One day,", "completion": " a cat.", "label": true}' \
    '{"prompt": "One day,", "completion": " a dog.", "label": "yes"}' >"$W/u.jsonl"
}
pref_prompt_differs() {
  printf '%s\n' \
    '{"chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go"}]}' \
    '{"chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "rejected": [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Go"}]}' \
    >"$W/p.jsonl"
}
# Online trainers: prompt rows, the second without a prompt or without an answer column.
prompts_no_prompt() {
  printf '%s\n' '{"prompt": "Add 1 and 2.", "answer": "3"}' '{"question": "Add 2 and 2."}' >"$W/q.jsonl"
}
prompts_no_answer() {
  printf '%s\n' '{"prompt": "Add 1 and 2.", "answer": "3"}' '{"prompt": "Add 2 and 2."}' >"$W/q.jsonl"
}
# Reward: a margin column whose second row has a text or no margin; a trained reward model.
pref_margin_text() {
  printf '%s\n' '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog.", "margin": 0.5}' \
    '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog.", "margin": "big"}' >"$W/p.jsonl"
}
pref_margin_missing() {
  printf '%s\n' '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog.", "margin": 0.5}' \
    '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog."}' >"$W/p.jsonl"
}
reward_model_prompts() {
  printf '%s\n' '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog."}' >"$W/p.jsonl"
  "$BIN" reward --model_name_or_path "$MODEL" --dataset "$W/p.jsonl" --max_steps 1 --device cpu \
    --output_dir "$W/rm" >/dev/null 2>&1 || echo "SKIP: could not train the reward model"
  printf '%s\n' '{"prompt": "One day,"}' >"$W/q.jsonl"
}
# Evaluation prompts for the online trainers; dataset folders without a usable train split.
eval_prompts() { printf '%s\n' '{"prompt": "Add 1 and 2.", "answer": "3"}' >"$W/q.jsonl"; }
folder_no_train() { mkdir -p "$W/dsf" && cp "$DATA" "$W/dsf/a.jsonl" && cp "$DATA" "$W/dsf/b.jsonl"; }
folder_train_shards() {
  mkdir -p "$W/dsf" && cp "$DATA" "$W/dsf/train-00000.jsonl" && cp "$DATA" "$W/dsf/train-00001.jsonl"
}
# Big enough that tokenizing it takes seconds on any machine: the SIGTERM lands while loading.
big_data() {
  for _ in $(seq 500); do cat "$DATA"; done >"$W/big1.jsonl"
  for _ in $(seq 10); do cat "$W/big1.jsonl"; done >"$W/big.jsonl"
  rm -f "$W/big1.jsonl"
}

# ---- checks after a run: files, not messages ----
check_no_torn_metrics() {
  local f=$W/out/metrics.jsonl
  [ -f "$f" ] || { echo "no $f"; return 1; }
  [ -z "$(tail -c 1 "$f")" ] || { echo "metrics.jsonl ends in a torn line"; return 1; }
  if grep -qv '^{.*}$' "$f"; then echo "metrics.jsonl has a torn line"; return 1; fi
  grep -q "record(s) lost" "$W/err" || { echo "no warning counting lost records"; return 1; }
}
check_metrics_disk_full() { check_no_torn_metrics; }
check_stale_tmp_removed() {
  [ ! -e "$W/out/.checkpoint-3.tmp-99999" ] || { echo "stale temp folder still there"; return 1; }
}
check_old_restored() {
  [ -f "$W/out/checkpoint-2/leantune_state.json" ] || { echo "checkpoint-2 not restored"; return 1; }
}
check_failed_save_cleans() {
  if ls -a "$W/out" | grep -q '^\.checkpoint-'; then echo "a failed save left its temp folder"; return 1; fi
}
check_max_memory_gib_tiny() {
  if grep -q zero_stage "$W/err"; then echo "the hint names zero_stage, which does not exist"; return 1; fi
}
check_pack_out_dir() {
  [ ! -e "$W/packed.tmp" ] || { echo "pack left packed.tmp"; return 1; }
}
# The table's own setups and checks.
# shellcheck disable=SC1090
[ -f "$HERE/${TABLE%.tsv}.sh" ] && . "$HERE/${TABLE%.tsv}.sh"

# Processes that still carry the run's marker: $1 the marker. Waits up to 2 s for them to end.
leftovers() {
  local tries pids
  for tries in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(grep -lsa "LT_ROBUSTNESS_RUN=$1" /proc/[0-9]*/environ 2>/dev/null |
           cut -d/ -f3 | grep -vx "$$" | tr '\n' ' ')
    [ -z "$pids" ] && return 0
    sleep 0.2
  done
  echo "$pids"
}

fail=0
ran=0
skipped=0
while IFS=$'\t' read -r name setup want frag args; do
  [ -z "$name" ] || [ "${name:0:1}" = "#" ] && continue
  [ -n "$FILTER" ] && [[ "$name" != *$FILTER* ]] && continue
  W=$T/case-$name
  mkdir -p "$W"
  if [ "$setup" != "-" ]; then
    "$setup" >"$W/setup.txt"
    msg=$(cat "$W/setup.txt")
    if [[ "$msg" == SKIP:* ]]; then
      echo "SKIPPED ($name): ${msg#SKIP: }"
      skipped=$((skipped + 1))
      continue
    fi
  fi
  steps=() ulimit_f="" envs=()
  while [[ "$args" == @* ]]; do
    word=${args%% *}
    args=${args#* }
    case $word in
      @TERM* | @WAIT*) steps+=("$word") ;;
      @ULIMIT_F*) ulimit_f=${word#@ULIMIT_F} ;;
      @ENV*) envs+=("${word#@ENV}") ;;
    esac
  done
  eval "set -- $args"
  marker="$$-$name-run"
  start=$(date +%s.%N)
  (
    [ -n "$ulimit_f" ] && ulimit -f "$ulimit_f"
    for e in "${envs[@]+"${envs[@]}"}"; do export "${e?}"; done
    export LT_ROBUSTNESS_RUN="$marker"
    cd "$W" && exec timeout -s KILL 120 "$BIN" "$@"
  ) >"$W/out.txt" 2>"$W/err" &
  pid=$!
  for step in "${steps[@]+"${steps[@]}"}"; do
    if [[ "$step" == @WAIT* ]]; then
      for _ in $(seq 600); do
        [ -s "$W/${step#@WAIT}" ] || ! kill -0 "$pid" 2>/dev/null && break
        sleep 0.1
      done
      continue
    fi
    sleep "${step#@TERM}"
    # The subshell has exec'd timeout; its child is trainer_bin.
    kill -TERM "$(pgrep -P "$pid" | head -1)" 2>/dev/null
  done
  wait "$pid"
  rc=$?
  ran=$((ran + 1))
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  frag=${frag//\$W/$W}
  if [ "$want" -eq 0 ]; then
    # A successful run: the fragment anywhere in its output.
    last=$(cat "$W/out.txt" "$W/err" | grep -F -- "$frag" | head -1)
  else
    last=$(grep -v '^$' "$W/err" | tail -1)
  fi
  errors=$(grep -c '^trainer_bin:' "$W/err")
  problem=""
  [ "$rc" -eq "$want" ] || problem="exit $rc, expected $want"
  [ -z "$problem" ] && [[ "$last" != *"$frag"* ]] && problem="message lacks '$frag'"
  [ -z "$problem" ] && [ "$want" -ne 0 ] && [ "$errors" -ne 1 ] &&
    problem="$errors error lines, expected one"
  left=$(leftovers "$marker")
  if [ -n "$left" ]; then
    [ -z "$problem" ] && problem="processes outlived trainer_bin: $left"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null
  fi
  if [ -z "$problem" ] && declare -F "check_$name" >/dev/null; then
    problem=$("check_$name") || true
  fi
  if [ -n "$problem" ]; then
    echo "FAIL ($name): $problem [$(printf '%.1f' "$secs") s]"
    echo "  stderr:"; sed 's/^/    /' "$W/err" | tail -5
    echo "  stdout:"; sed 's/^/    /' "$W/out.txt" | tail -3
    fail=1
  else
    echo "ok ($name, exit $rc, $(printf '%.1f' "$secs") s): $last"
  fi
done <"$HERE/$TABLE"
echo "$ran cases run, $skipped skipped"
[ "$ran" -gt 0 ] || [ "$skipped" -gt 0 ] || fail=1
exit $fail
