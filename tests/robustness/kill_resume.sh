#!/usr/bin/env bash
# Kill-and-resume: a small run is stopped 10 times at random moments (a fixed seed), resumed
# from the latest checkpoint after each stop, and must end with weights bit-identical to the
# straight run's.
#   kill mode (default): SIGKILL; the even-numbered kills wait for a checkpoint save to be under
#     way. Cases: sft (full fine-tuning), sft_lora, dpo_lora and reward_lora (LoRA with its
#     default dropout 0.05: the dropout stream's offset must come back with the checkpoint).
#   term mode: SIGTERM, each stop a clean exit 0 that saves the last completed update, wherever
#     the signal lands. Cases: sft_accum (4 micro-batches per update: most signals land between
#     two of them, and that update is abandoned), kto_lora (2 per update) and grpo_lora (LoRA,
#     completions of up to 24 tokens from a reward command: signals land in generation phases
#     and while the command is awaited).
# Disk-full variant (root with tmpfs only, else SKIPPED): the output folder lives on a small
# tmpfs. Keeping every checkpoint must fail with exit 2 naming the full disk, leaving no
# temporary folder and no torn metrics line; a kill during a save on the nearly full disk must
# not stop the resume (start-up removes the stale folder), which, with save_total_limit, then
# ends bit-identical to the straight run.
# usage: kill_resume.sh TRAINER_BIN SOURCE_DIR [kill|term|disk_full] [CASE...]   (exit 77 = skipped)
#   KEEP_T=1 keeps the temporary folder (the runs' logs) for a look after a failure.
set -u
BIN=$(realpath "$1")
SRC=$(realpath "$2")
MODE=${3:-kill}
shift $(($# < 3 ? $# : 3))
T=$(mktemp -d)
MNT=""
cleanup() {
  [ -n "$MNT" ] && umount "$MNT" 2>/dev/null
  [ -n "${KEEP_T:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
RANDOM=20261123
DATA=$SRC/tests/fixtures/trainer/stories_small.jsonl
"$BIN" init-model --config "$SRC/data/embedded/config.json" --out "$T/model" \
    --tokenizer "$SRC/data/embedded" >/dev/null || { echo "FAIL: init-model"; exit 1; }

# A case's trainer_bin arguments (everything but --output_dir and resuming), and the file compared.
CASE=sft
args() {
  local sft=(sft --model_name_or_path "$T/model" --dataset "$DATA" --max_length 64
             --per_device_train_batch_size 4 --device cpu --logging_steps 1 --save_steps 3)
  case $CASE in
    sft) echo "${sft[@]}" --max_steps 40 ;;
    sft_lora) echo "${sft[@]}" --max_steps 40 --use_peft ;;
    sft_accum) echo "${sft[@]}" --max_steps 12 --per_device_train_batch_size 2 \
                 --gradient_accumulation_steps 4 --save_steps 0 ;;
    dpo_lora) echo dpo --use_peft --max_steps 30 --save_steps 3 --logging_steps 1 --device cpu ;;
    reward_lora) echo reward --use_peft --max_steps 30 --save_steps 3 --logging_steps 1 \
                   --device cpu ;;
    kto_lora) echo kto --use_peft --gradient_accumulation_steps 2 --max_steps 30 --save_steps 0 \
                --logging_steps 1 --device cpu ;;
    grpo_lora) echo grpo --use_peft --max_steps 12 --save_steps 0 --logging_steps 1 --device cpu \
                 --max_completion_length 24 --reward_funcs "''" \
                 --reward_command "'bash $SRC/tests/fixtures/online/digit_reward.sh'" ;;
  esac
}
weights() {
  case $CASE in *_lora) echo adapter_model.safetensors ;; *) echo model.safetensors ;; esac
}
run() {  # run OUT_DIR [extra options...]; called in a subshell, which becomes trainer_bin
  local out=$1
  shift
  eval "exec \"\$BIN\" $(args) --output_dir \"\$out\" \"\$@\""
}
resume_flag() { [ -n "$(ls -d "$1"/checkpoint-* 2>/dev/null)" ] && echo "--resume_from_checkpoint latest"; }

# Stops a run with SIGKILL or SIGTERM at a random moment after its first update (start-up takes
# longer on a loaded machine), or (during_save) as soon as a save's temp folder appears; a
# SIGTERM'd run must exit 0.
stop_run() {  # signal out_dir during_save [extra options...]
  local sig=$1 out=$2 during=$3
  shift 3
  local lines
  lines=$(wc -l <"$T/stops.log")
  # During a save: every save of this run pauses 300 ms with its files written (a LoRA adapter's
  # save takes milliseconds, which a poll on a loaded machine misses).
  local pause=0
  [ "$during" = 1 ] && pause=300
  # shellcheck disable=SC2046
  (export LEANTUNE_TEST_SAVE_PAUSE_MS=$pause; run "$out" $(resume_flag "$out") "$@") \
    >>"$T/stops.log" 2>&1 &
  local pid=$! waited=0
  if [ "$during" = 0 ]; then
    while kill -0 "$pid" 2>/dev/null && [ $waited -lt 3000 ] &&
          ! tail -n +$((lines + 1)) "$T/stops.log" | grep -q '^step [0-9]'; do
      sleep 0.01
      waited=$((waited + 1))
    done
  fi
  if [ "$during" = 1 ]; then
    while kill -0 "$pid" 2>/dev/null && [ $waited -lt 3000 ]; do
      if compgen -G "$out/.checkpoint-*.tmp-*" >/dev/null; then break; fi
      sleep 0.005
      waited=$((waited + 1))
    done
  else
    sleep "0.$(printf %03d $((RANDOM % 1000)))"
  fi
  kill "-$sig" "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  local rc=$?
  [ "$sig" = KILL ] || [ $rc -eq 0 ] || { echo "FAIL ($CASE): a SIGTERM gave exit $rc"; return 1; }
}

# One case: the straight run, 10 (or more) stops and resumes, the last resume, the comparison.
stop_and_resume() {  # KILL|TERM
  local sig=$1 start secs want got during_saves=0 i
  : >"$T/stops.log"
  start=$(date +%s)
  (run "$T/$CASE-straight") >"$T/straight.log" 2>&1 ||
    { echo "FAIL ($CASE): straight run"; tail -3 "$T/straight.log"; return 1; }
  secs=$(( $(date +%s) - start + 1 ))
  want=$(sha256sum <"$T/$CASE-straight/$(weights)")
  # 10 stops; under SIGKILL more (up to 24) while fewer than 2 landed during a save (a run may
  # end, or not reach a save, before its stop).
  i=0
  while [ $i -lt 10 ] || { [ "$sig" = KILL ] && [ $during_saves -lt 2 ] && [ $i -lt 24 ]; }; do
    i=$((i + 1))
    stop_run "$sig" "$T/$CASE" $([ "$sig" = KILL ] && echo $((i % 2)) || echo 0) || return 1
    compgen -G "$T/$CASE/.checkpoint-*.tmp-*" >/dev/null && during_saves=$((during_saves + 1))
  done
  # shellcheck disable=SC2046
  (run "$T/$CASE" $(resume_flag "$T/$CASE")) >"$T/final.log" 2>&1 ||
    { echo "FAIL ($CASE): the last resume"; tail -5 "$T/final.log"; return 1; }
  got=$(sha256sum <"$T/$CASE/$(weights)")
  local resumes abandoned
  resumes=$(cat "$T/stops.log" "$T/final.log" | grep -c 'resumed from step')
  abandoned=$(grep -c 'which is abandoned' "$T/stops.log")
  local where="$during_saves during a save"
  [ "$sig" = TERM ] && where="$abandoned in the middle of an update"
  echo "$CASE: $i SIG$sig ($where; straight run ${secs}s), $resumes resumes"
  if [ "$sig" = KILL ] && [ "$during_saves" -lt 2 ]; then
    echo "FAIL ($CASE): fewer than 2 kills landed during a save"; return 1
  fi
  [ "$resumes" -ge 3 ] || { echo "FAIL ($CASE): fewer than 3 runs resumed a checkpoint"; return 1; }
  [ "$got" = "$want" ] ||
    { echo "FAIL ($CASE): resumed weights differ from the straight run"; return 1; }
  echo "ok ($CASE): bit-identical to the straight run"
}

if [ "$MODE" = kill ] || [ "$MODE" = term ]; then
  cases=("$@")
  if [ ${#cases[@]} -eq 0 ]; then
    cases=(sft_accum kto_lora grpo_lora)
    [ "$MODE" = kill ] && cases=(sft sft_lora dpo_lora reward_lora)
  fi
  fail=0
  for CASE in "${cases[@]}"; do
    stop_and_resume "$([ "$MODE" = kill ] && echo KILL || echo TERM)" || fail=1
  done
  exit $fail
fi

# ---- disk-full variant ----
if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: the disk-full variant needs root to mount a tmpfs"; exit 77; fi
CASE=sft
(run "$T/straight") >"$T/straight.log" 2>&1 || { echo "FAIL: straight run"; cat "$T/straight.log"; exit 1; }
want=$(sha256sum <"$T/straight/model.safetensors")
MNT=$T/small
mkdir -p "$MNT"
# About three checkpoints (model + optimizer, ~14 MB each) fit.
mount -t tmpfs -o size=48m tmpfs "$MNT" 2>/dev/null ||
  { MNT=""; echo "SKIPPED: cannot mount a tmpfs here"; exit 77; }
(run "$MNT/full") >"$T/full.log" 2>&1
rc=$?
fail=0
[ $rc -eq 2 ] || { echo "FAIL: a full disk gave exit $rc, expected 2"; fail=1; }
tail -1 "$T/full.log" | grep -q "No space left on device" ||
  { echo "FAIL: the error does not name the full disk: $(tail -1 "$T/full.log")"; fail=1; }
compgen -G "$MNT/full/.checkpoint-*" >/dev/null && { echo "FAIL: the failed save left its temp folder"; fail=1; }
grep -qv '^{.*}$' "$MNT/full/metrics.jsonl" && { echo "FAIL: torn metrics line"; fail=1; }
# Nearly full: room for two checkpoints (~10 MB each) and a little more. Two kills during saves
# leave a partial temp folder; without the start-up clean-up the next save would not fit.
rm -rf "$MNT/full"
head -c $(( $(df --output=avail -B1 "$MNT" | tail -1) - 25000000 )) /dev/zero >"$MNT/filler"
: >"$T/stops.log"
stop_run KILL "$MNT/k" 1 --save_total_limit 1
stop_run KILL "$MNT/k" 1 --save_total_limit 1
compgen -G "$MNT/k/.checkpoint-*.tmp-*" >/dev/null || echo "note: the kill missed the save"
# shellcheck disable=SC2046
(run "$MNT/k" --save_total_limit 1 $(resume_flag "$MNT/k")) >"$T/k.log" 2>&1 ||
  { echo "FAIL: resume on the nearly full disk: $(tail -1 "$T/k.log")"; fail=1; }
grep -h "temporary checkpoint folder" "$T/k.log"
got=$(sha256sum <"$MNT/k/model.safetensors" 2>/dev/null)
[ "$got" = "$want" ] || { echo "FAIL: resumed weights differ from the straight run"; fail=1; }
[ $fail -eq 0 ] && echo "ok: disk full is exit 2 with no temp folder left; resume after a kill is bit-identical"
exit $fail
