#!/usr/bin/env bash
# cpu_suite.sh: CPU training speed of the reference model (bench/configs/llama-48m.json: a
# 48.4M-parameter Llama, 8 layers x 512 hidden, SmolLM2's 49,152-token vocabulary, tied
# embeddings) under `trainer_bin sft`, with the BLAS kernels trainer_bin chooses, beside the
# PyTorch + transformers baseline on the same rows (bench/torch_baseline.py --device cpu: fp32,
# the same threads), and records bench/results/<yyyy-mm-dd>-cpu-<cpu>.json.
#
#   bench/cpu_suite.sh [--steps N] [--threads T] [--repeat R] [--families] [--no-torch]
#
# Each run trains N steps (default 4) of one 2,048-token row (pre-tokenized ids, the same rows
# for every run and for PyTorch); tokens/s is over the steps after the first (the first is a
# warm-up). With --repeat R (default 1) every run, PyTorch's too, is repeated R times, round
# robin, and the best is recorded (on a shared machine the best is the least disturbed; every
# figure is kept under "all", with the load average before and after). Each run's CPU time
# (user + system, whole process) is recorded too: other processes barely change it, so runs of
# the same kernels agree on it where their wall-clock speeds differ with the load.
# --families adds a run per OpenBLAS kernel family (LEANTUNE_BLAS_CORETYPE; a family this CPU
# cannot run is an error entry) and one where the library's detection of its generic Prescott
# kernels is simulated (LEANTUNE_BLAS_SIMULATE_DETECTED), which trainer_bin must bring to the
# best family's speed.
# BUILD (default build/) holds trainer_bin; PYTHON (default python3) needs torch and
# transformers, else the baseline is recorded as an error.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$(pwd)
BUILD=${BUILD:-$ROOT/build}
PYTHON=${PYTHON:-python3}
STEPS=4
THREADS=${OMP_NUM_THREADS:-$(nproc)}
FAMILIES=0
TORCH=1
REPEAT=1
while [ $# -gt 0 ]; do
  case $1 in
    --steps) STEPS=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --families) FAMILIES=1 ;;
    --no-torch) TORCH=0 ;;
    *) echo "cpu_suite.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$STEPS" -ge 2 ] || { echo "cpu_suite.sh: --steps must be at least 2" >&2; exit 2; }
BIN=$BUILD/trainer_bin
[ -x "$BIN" ] ||
  { echo "cpu_suite.sh: no $BIN (cmake --build build --target trainer_bin)" >&2; exit 2; }
CONFIG=$ROOT/bench/configs/llama-48m.json
log() { printf '[cpu_suite] %s\n' "$*" >&2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BIN" init-model --config "$CONFIG" --out "$T/model" \
  --tokenizer "$ROOT/tests/fixtures/tokenizers/smollm2" >/dev/null || exit 1
echo '{"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}' \
  >"$T/model/tokenizer_config.json"
# STEPS rows of 2,048 ids in [1, 49152), from a fixed linear congruential sequence.
awk -v rows="$STEPS" 'BEGIN { s = 12345; for (r = 0; r < rows; r++) { printf "{\"input_ids\": [";
  for (i = 0; i < 2048; i++) { s = (s * 1103515245 + 12345) % 2147483648;
    printf "%s%d", (i ? ", " : ""), 1 + int(s / 65536) % 49151 } print "]}" } }' >"$T/tokens.jsonl"

export OMP_NUM_THREADS=$THREADS
# run LABEL ENV...: trains; prints "<tokens/s> <CPU seconds> <BLAS line>".
run() {
  local label=$1
  shift
  log "sft ($label): $*"
  rm -rf "$T/run-$label"
  local TIMEFORMAT="%U %S" cpu
  { time env "$@" "$BIN" sft --model_name_or_path "$T/model" --dataset "$T/tokens.jsonl" \
    --max_length 2048 --per_device_train_batch_size 1 --max_steps "$STEPS" --logging_steps 1 \
    --learning_rate 1e-4 --save_steps 0 --output_dir "$T/run-$label" >"$T/$label.out" 2>&1
  } 2>"$T/$label.time" || { log "sft ($label) failed: $(tail -n 1 "$T/$label.out")"; return 1; }
  cpu=$(awk '{ printf "%.1f", $1 + $2 }' "$T/$label.time")
  # Every step trains 2,048 tokens: tokens/s over steps 2..N is their harmonic mean.
  local tps
  tps=$(grep -o '"tokens_per_second":[0-9.e+]*' "$T/run-$label/metrics.jsonl" | cut -d: -f2 |
        awk 'NR > 1 { t += 1 / $1; n++ } END { if (n) printf "%.1f", n / t }')
  echo "$tps $cpu $(grep -m1 '^BLAS: ' "$T/$label.out")"
}

cpu_model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
family=$(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
model=$(grep -m1 '^model' /proc/cpuinfo | grep -v name | cut -d: -f2 | tr -d ' ')
device="$cpu_model (family $family, model $model)"
slug=$(echo "$cpu_model-$family-$model" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/-$//')
labels=(chosen)
envs=("A=1")
if [ "$FAMILIES" -eq 1 ]; then
  labels+=(simulated_prescott)
  envs+=("OPENBLAS_CORETYPE=Prescott LEANTUNE_BLAS_SIMULATE_DETECTED=Prescott")
  for fam in Prescott Haswell Zen SkylakeX Cooperlake; do
    labels+=("$fam")
    envs+=("LEANTUNE_BLAS_CORETYPE=$fam")
  done
fi
# best LIST / least LIST: the largest / smallest of the space-separated figures.
best() { echo "$1" | tr ' ' '\n' | awk 'NF && (!n++ || $1 > m) { m = $1 } END { print m }'; }
least() { echo "$1" | tr ' ' '\n' | awk 'NF && (!n++ || $1 < m) { m = $1 } END { print m }'; }
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A all cpu_all blas_line error
torch_all="" torch_json=""
for round in $(seq "$REPEAT"); do
  for i in "${!labels[@]}"; do
    label=${labels[$i]}
    # shellcheck disable=SC2086  # the environment words
    if out=$(run "$label" ${envs[$i]}); then
      read -r tps cpu line <<<"$out"
      all[$label]+="$tps "
      cpu_all[$label]+="$cpu "
      blas_line[$label]=$line
      log "round $round, $label: $tps tokens/s, $cpu CPU s; $line"
    else
      error[$label]=$(tail -n 1 "$T/$label.out" | tr -d '"\\')
    fi
  done
  if [ "$TORCH" -eq 1 ]; then
    log "round $round, torch: $PYTHON bench/torch_baseline.py --device cpu ..."
    j=$("$PYTHON" "$ROOT/bench/torch_baseline.py" --device cpu --config "$CONFIG" \
      --tokens "$T/tokens.jsonl" --seqs 1 --seq-len 2048 --steps $((STEPS - 1)) --warmup 1 \
      --threads "$THREADS" --gradient-checkpointing off 2>"$T/torch.err" | tail -n 1)
    tps=$(echo "$j" | grep -o '"tokens_per_s": [0-9.e+]*' | cut -d' ' -f2)
    if [ -n "$tps" ]; then
      torch_all+="$(printf '%.1f' "$tps") "
      # The JSON of the best run so far.
      [ "$(best "$torch_all")" = "$(printf '%.1f' "$tps")" ] && torch_json=$j
    elif [ -z "$torch_json" ]; then
      torch_json=${j:-"{\"error\": \"$(tail -n 1 "$T/torch.err" | tr -d '"\\')\"}"}
    fi
  fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
[ "$TORCH" -eq 1 ] || torch_json='{"error": "not run (--no-torch)"}'
figures="" runs="" blas="" errors=""
for label in "${labels[@]}"; do
  if [ -n "${all[$label]:-}" ]; then
    figures+="\"sft_tokens_per_s_$label\": $(best "${all[$label]}"), "
    figures+="\"sft_cpu_seconds_$label\": $(least "${cpu_all[$label]}"), "
    runs+="\"sft_tokens_per_s_$label\": [$(echo ${all[$label]} | tr ' ' ',')], "
    runs+="\"sft_cpu_seconds_$label\": [$(echo ${cpu_all[$label]} | tr ' ' ',')], "
    blas+="\"$label\": \"${blas_line[$label]}\", "
  fi
  [ -n "${error[$label]:-}" ] && errors+="\"sft_$label\": \"${error[$label]}\", "
done
if [ -n "$torch_all" ]; then
  figures+="\"torch_tokens_per_s\": $(best "$torch_all"), "
  runs+="\"torch_tokens_per_s\": [$(echo $torch_all | tr ' ' ',')], "
  [ -n "${all[chosen]:-}" ] && figures+="\"sft_vs_torch\": $(awk -v a="$(best "${all[chosen]}")" \
    -v b="$(best "$torch_all")" 'BEGIN { printf "%.2f", a / b }'), "
fi
command="bench/cpu_suite.sh --steps $STEPS --threads $THREADS --repeat $REPEAT"
[ "$FAMILIES" -eq 1 ] && command+=" --families"
date=$(date +%F)
out=$ROOT/bench/results/$date-cpu-$slug.json
cat >"$out" <<EOF
{
  "commit": "$(git rev-parse HEAD 2>/dev/null)", "date": "$date", "device": "$device",
  "threads": $THREADS, "steps": $STEPS, "tokens_per_step": 2048,
  "model": "bench/configs/llama-48m.json",
  "command": "$command",
  "load_average": {"before": "$load_before", "after": "$load_after"},
  "figures": {${figures%, }},
  "all": {${runs%, }},
  "blas": {${blas%, }},
  "torch": $torch_json,
  "errors": {${errors%, }}
}
EOF
log "wrote $out"
cat "$out"
