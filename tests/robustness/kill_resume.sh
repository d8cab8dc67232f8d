#!/usr/bin/env bash
# Kill-and-resume: a small run is killed with SIGKILL 10 times at random moments (a fixed seed;
# the even-numbered kills wait for a checkpoint save to be under way), resumed from the latest
# checkpoint after each kill, and must end with a model.safetensors bit-identical to the
# straight run's.
# Disk-full variant (root with tmpfs only, else SKIPPED): the output folder lives on a small
# tmpfs. Keeping every checkpoint must fail with exit 2 naming the full disk, leaving no
# temporary folder and no torn metrics line; a kill during a save on the nearly full disk must
# not stop the resume (start-up removes the stale folder), which, with save_total_limit, then
# ends bit-identical to the straight run.
# usage: kill_resume.sh TRAINER_BIN SOURCE_DIR [disk_full]   (exit 77 = skipped)
set -u
BIN=$(realpath "$1")
SRC=$(realpath "$2")
MODE=${3:-kill}
T=$(mktemp -d)
MNT=""
cleanup() {
  [ -n "$MNT" ] && umount "$MNT" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
RANDOM=20261123
STEPS=40
"$BIN" init-model --config "$SRC/data/embedded/config.json" --out "$T/model" \
    --tokenizer "$SRC/data/embedded" >/dev/null || { echo "FAIL: init-model"; exit 1; }
run() {  # run OUT_DIR [extra options...]; called in a subshell, which becomes trainer_bin
  local out=$1
  shift
  exec "$BIN" sft --model_name_or_path "$T/model" --dataset "$SRC/tests/fixtures/trainer/stories_small.jsonl" \
      --max_length 64 --per_device_train_batch_size 4 --device cpu --logging_steps 1 \
      --max_steps $STEPS --save_steps 3 --output_dir "$out" "$@"
}
resume_flag() { [ -n "$(ls -d "$1"/checkpoint-* 2>/dev/null)" ] && echo "--resume_from_checkpoint latest"; }

start=$(date +%s)
(run "$T/straight") >"$T/straight.log" 2>&1 || { echo "FAIL: straight run"; cat "$T/straight.log"; exit 1; }
secs=$(( $(date +%s) - start + 1 ))
want=$(sha256sum <"$T/straight/model.safetensors")

# Kills a run after a random delay, or (during_save) as soon as a save's temp folder appears.
kill_run() {  # out_dir during_save [extra options...]
  local out=$1 during=$2
  shift 2
  # shellcheck disable=SC2046
  (run "$out" $(resume_flag "$out") "$@") >>"$T/kills.log" 2>&1 &
  local pid=$! waited=0
  if [ "$during" = 1 ]; then
    while kill -0 "$pid" 2>/dev/null && [ $waited -lt 3000 ]; do
      if compgen -G "$out/.checkpoint-*.tmp-*" >/dev/null; then break; fi
      sleep 0.005
      waited=$((waited + 1))
    done
  else
    sleep "0.$(printf %03d $((RANDOM % 1000)))"
  fi
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

if [ "$MODE" = kill ]; then
  during_saves=0
  for i in $(seq 10); do
    kill_run "$T/killed" $((i % 2))
    compgen -G "$T/killed/.checkpoint-*.tmp-*" >/dev/null && during_saves=$((during_saves + 1))
  done
  # shellcheck disable=SC2046
  (run "$T/killed" $(resume_flag "$T/killed")) >"$T/final.log" 2>&1 ||
    { echo "FAIL: the last resume"; tail -5 "$T/final.log"; exit 1; }
  got=$(sha256sum <"$T/killed/model.safetensors")
  echo "10 kills ($during_saves during a save, straight run ${secs}s); $(grep -c 'resumed from step' "$T/kills.log" "$T/final.log" | awk -F: '{s+=$2} END {print s}') resumes"
  [ "$during_saves" -ge 2 ] || { echo "FAIL: fewer than 2 kills landed during a save"; exit 1; }
  [ "$got" = "$want" ] || { echo "FAIL: resumed weights differ from the straight run"; exit 1; }
  echo "ok: bit-identical to the straight run"
  exit 0
fi

# ---- disk-full variant ----
if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: the disk-full variant needs root to mount a tmpfs"; exit 77; fi
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
kill_run "$MNT/k" 1 --save_total_limit 1
kill_run "$MNT/k" 1 --save_total_limit 1
compgen -G "$MNT/k/.checkpoint-*.tmp-*" >/dev/null || echo "note: the kill missed the save"
# shellcheck disable=SC2046
(run "$MNT/k" --save_total_limit 1 $(resume_flag "$MNT/k")) >"$T/k.log" 2>&1 ||
  { echo "FAIL: resume on the nearly full disk: $(tail -1 "$T/k.log")"; fail=1; }
grep -h "temporary checkpoint folder" "$T/k.log"
got=$(sha256sum <"$MNT/k/model.safetensors" 2>/dev/null)
[ "$got" = "$want" ] || { echo "FAIL: resumed weights differ from the straight run"; fail=1; }
[ $fail -eq 0 ] && echo "ok: disk full is exit 2 with no temp folder left; resume after a kill is bit-identical"
exit $fail
