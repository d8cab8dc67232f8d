#!/bin/bash
# Context-parallel SFT under mpirun against the single-process run with the same global batch
# (tests/dist/context_parallel.cmake), on the tiny test model (f32).
# Usage: context_parallel.sh TRAINER_BIN MPIRUN SOURCE_DIR CASE
#   cp2, cp4            N ranks, --cp_size N, vs 1 rank: the 10 losses agree within 1e-5 relative
#   dp2_cp2             4 ranks, --cp_size 2 (2 data shards) vs 1 rank x 2 micro-batches
#   cp2_checkpointing   cp2 with --gradient_checkpointing (the recompute runs the ring again)
#   cp2_packing         cp2 with --packing (several documents per sequence, each split)
#   dp2_cp2_zero2       dp2_cp2 under --zero_stage 2 (shards over the world)
#   cp2_qlora           cp2 training LoRA adapters over a 4-bit (NF4) base
#   cp2_eval            cp2 with an eval dataset: the eval losses through the ring equal one
#                       process's within 1e-5
#   dp2_cp2_zero3       dp2_cp2 under --zero_stage 3 (parameters sharded over the world too;
#                       each layer gathered around the ring attention's collectives)
#   cp2_lora_offload    cp2 training LoRA adapters (no dropout) with activation offloading
#   activation_memory   the activation-tag peak per rank at cp 2 is below 0.65x that of cp 1 on
#                       256-token sequences
#   resume              2 ranks at cp 2 stopped at a checkpoint and resumed end bit-identical to
#                       the straight run; resuming with another cp_size is refused in one line
#   estimate            trainer_bin estimate --cp_size: activations per rank halve at cp 2 (as
#                       measured by activation_memory), --budget_gib names the smallest cp_size
#                       that fits in one line (no mpirun needed)
#   dpo_cp2             trainer_bin dpo (sigmoid loss) on 2 ranks at --cp_size 2 vs 1 rank: the
#                       10 losses agree within 1e-5 relative, and so do the DPO metrics
#   dpo_dp2_cp2         dpo on 4 ranks, --cp_size 2 (2 data shards) vs 1 rank x 2 micro-batches,
#                       with the ipo loss (token-averaged log-probabilities) and padding_free;
#                       the metrics (rank 0's shard) equal those of 2 ranks without cp
#   kto_cp2             trainer_bin kto (with its KL term) on 2 ranks at --cp_size 2 vs 1 rank:
#                       losses within 1e-5 relative, KL within 1e-5 relative + 1e-4
#   kto_dp2_cp2         kto on 4 ranks, --cp_size 2, vs 2 ranks without cp (the KL estimate is
#                       the data shards' mean): the same bounds
#   refusals            world size not a multiple of cp_size, pad_to_multiple_of not a multiple
#                       of 2cp, a trainer without context parallelism (reward): exit 2, one line
set -u
bin=$1 mpirun=$2 src=$3 case=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
mpi() { local np=$1; shift; timeout 250 "$mpirun" --oversubscribe --allow-run-as-root \
          --bind-to none -x OMP_NUM_THREADS -np "$np" "$bin" "$@"; }
"$bin" init-model --model_config "$src/tests/fixtures/trainer/tiny_config.json" \
  --out "$work/model" --tokenizer "$src/data/embedded" >/dev/null || fail "init-model"
common=(sft --model_name_or_path "$work/model" --dataset "$src/tests/fixtures/trainer/stories_small.jsonl"
        --max_steps 10 --per_device_train_batch_size 2 --max_length 64 --learning_rate 1e-3
        --logging_steps 1 --save_steps 0 --device cpu)
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
# Relative agreement of two loss columns within $3 (and 10 of them).
close() {
  paste <(losses "$1") <(losses "$2") | awk -v tol="$3" '
    { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
      if (d > tol * m) { printf "step %d: %s vs %s\n", NR, $1, $2; bad = 1 } ; n++ }
    END { if (n != 10) { print n " losses"; exit 1 } exit bad }'
}
tag_peak() { tail -1 "$1/metrics.jsonl" | grep -o "\"$2\":{[^}]*}" | grep -o '"peak":[0-9]*' | cut -d: -f2; }
# DPO on the tiny model with the built-in preference pairs (sequences of ~30 tokens).
dpo_common=(dpo --model_name_or_path "$work/model" --dataset "$src/data/embedded/preferences.jsonl"
            --max_steps 10 --per_device_train_batch_size 2 --max_length 64 --learning_rate 1e-3
            --logging_steps 1 --save_steps 0 --device cpu)
# compare NP CP ACCUM EXTRA...: the single process with ACCUM micro-batches vs NP ranks.
compare() {
  local np=$1 cp=$2 accum=$3; shift 3
  "$bin" "${common[@]}" "$@" --gradient_accumulation_steps "$accum" --output_dir "$work/one" \
    >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
  mpi "$np" "${common[@]}" "$@" --cp_size "$cp" --output_dir "$work/cp" >"$work/cp.log" 2>&1 ||
    { cat "$work/cp.log"; fail "$np ranks, cp_size $cp"; }
  close "$work/one" "$work/cp" 1e-5 || fail "losses beyond 1e-5 relative"
  # Without data parallel every rank logs the whole micro-batches: the entropy of their label
  # tokens (sft's and dpo's metric, summed over the cp group) is one process's.
  if [ "$np" = "$cp" ]; then
    ent() { grep -o '"entropy":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }
    [ "$(ent "$work/one" | wc -l)" -ge 1 ] || fail "no entropy logged"
    paste <(ent "$work/one") <(ent "$work/cp") | awk '
      { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1 + 1e-6) { print "entropy " NR ": " $1 " vs " $2; bad = 1 } }
      END { exit bad }' || fail "entropy beyond 1e-5 relative"
  fi
  # The curve moved: a run that did not train would agree trivially.
  paste <(losses "$work/one" | head -1) <(losses "$work/one" | tail -1) |
    awk '{ exit !($1 - $2 > 0.05) }' || fail "the loss did not fall: $(losses "$work/one" | tr '\n' ' ')"
  echo "ok: $np ranks (cp_size $cp${*:+ $*}) == 1 rank x $accum: $(losses "$work/cp" | tr '\n' ' ')"
}

case $case in
  cp2) compare 2 2 1 ;;
  cp4) compare 4 4 1 ;;
  dp2_cp2) compare 4 2 2 ;;
  cp2_checkpointing) compare 2 2 1 --gradient_checkpointing ;;
  cp2_packing) compare 2 2 1 --packing ;;
  dp2_cp2_zero2) compare 4 2 2 --zero_stage 2 --reduce_bucket_size 20000 ;;
  dpo_cp2|dpo_dp2_cp2)
    common=("${dpo_common[@]}")
    ref=one
    if [ "$case" = dpo_cp2 ]; then compare 2 2 1; else
      extra=(--loss_type ipo --padding_free)
      compare 4 2 2 "${extra[@]}"
      # Data parallel logs rank 0's micro-batches' metrics: those of 2 ranks without cp.
      mpi 2 "${common[@]}" "${extra[@]}" --output_dir "$work/dp" >"$work/dp.log" 2>&1 ||
        { cat "$work/dp.log"; fail "2 ranks, cp_size 1"; }
      ref=dp
    fi
    # The metrics come from the summed log-probabilities: the single-process values. (At step 1
    # the policy is the reference; the reference runs the ring too, so every margin is exactly 0
    # as in one process, and rewards/accuracies, a count of margins > 0, agrees from step 1.)
    metric() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2; }
    for m in rewards/chosen rewards/margins rewards/accuracies logps/chosen logps/rejected \
             logits/chosen entropy mean_token_accuracy; do
      [ "$(metric "$work/$ref" "$m" | wc -l)" -ge 9 ] || fail "no $m"
      paste <(metric "$work/$ref" "$m") <(metric "$work/cp" "$m") | awk -v m="$m" '
        { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1;
          if (d > 1e-5 * a + 1e-6) { print m " step " NR ": " $1 " vs " $2; bad = 1 } }
        END { exit bad }' || fail "$m beyond 1e-5 relative"
    done
    echo "ok: dpo metrics agree" ;;
  kto_cp2|kto_dp2_cp2)
    # trainer_bin kto (the kto loss: its KL term from the micro-batch's mismatched completions,
    # scored through the ring too) on the built-in unpaired demo: cp ranks vs one process.
    common=(kto --max_steps 10 --per_device_train_batch_size 4 --max_length 64 --logging_steps 1
            --save_steps 0 --device cpu)
    if [ "$case" = kto_cp2 ]; then
      compare 2 2 1
    else
      # 2 data shards: the KL estimate is the shards' mean (TRL gathers it over the ranks), as on
      # 2 ranks without cp; the losses equal those within 1e-5.
      mpi 2 "${common[@]}" --output_dir "$work/one" >"$work/one.log" 2>&1 ||
        { cat "$work/one.log"; fail "2 ranks, cp_size 1"; }
      mpi 4 "${common[@]}" --cp_size 2 --output_dir "$work/cp" >"$work/cp.log" 2>&1 ||
        { cat "$work/cp.log"; fail "4 ranks, cp_size 2"; }
      close "$work/one" "$work/cp" 1e-5 || fail "losses beyond 1e-5 relative"
    fi
    # The KL estimate is a difference of sums of log-probabilities a hundred times its size, so
    # their last-bit differences (the ring sums in another order) show 100x larger in it: within
    # 1e-5 relative plus 1e-4 absolute.
    kl() { grep -o '"kl":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }
    [ "$(kl "$work/one" | wc -l)" -ge 9 ] || fail "no kl"
    paste <(kl "$work/one") <(kl "$work/cp") | awk '
      { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1;
        if (d > 1e-5 * a + 1e-4) { print "kl step " NR ": " $1 " vs " $2; bad = 1 } }
      END { exit bad }' || fail "kl beyond 1e-5 relative + 1e-4"
    echo "ok: kto at cp_size 2 ($case): losses and KL agree" ;;
  cp2_eval)
    # Evaluation runs the ring too: the eval loss of each evaluation equals one process's.
    ev=(--eval_dataset "$src/tests/fixtures/trainer/stories_small.jsonl" --eval_steps 5
        --per_device_eval_batch_size 2)
    compare 2 2 1 "${ev[@]}"
    evals() { grep -o '"eval_loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }
    [ "$(evals "$work/one" | wc -l)" -ge 2 ] || fail "no evaluations"
    paste <(evals "$work/one") <(evals "$work/cp") | awk '
      { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "eval " NR ": " $1 " vs " $2; bad = 1 } }
      END { exit bad }' || fail "eval losses beyond 1e-5 relative"
    echo "ok: eval losses $(evals "$work/cp" | tr '\n' ' ')" ;;
  cp2_qlora) compare 2 2 1 --use_peft --load_in_4bit --lora_dropout 0 ;;
  dp2_cp2_zero3) compare 4 2 2 --zero_stage 3 --stage3_param_persistence_threshold 100 ;;
  cp2_lora_offload) compare 2 2 1 --use_peft --lora_dropout 0 --learning_rate 1e-2 --activation_offloading ;;
  activation_memory)
    run=(sft --model_name_or_path "$work/model" --dataset "$src/tests/fixtures/trainer/stories_small.jsonl"
         --max_steps 2 --per_device_train_batch_size 1 --max_length 256 --packing
         --logging_steps 1 --save_steps 0 --device cpu)
    "$bin" "${run[@]}" --output_dir "$work/one" >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "cp 1"; }
    mpi 2 "${run[@]}" --cp_size 2 --output_dir "$work/cp" >"$work/cp.log" 2>&1 ||
      { cat "$work/cp.log"; fail "cp 2"; }
    one=$(tag_peak "$work/one" activation) cp=$(tag_peak "$work/cp" activation)
    [ -n "$one" ] && [ -n "$cp" ] || fail "no activation peak in metrics.jsonl"
    awk -v a="$one" -v b="$cp" 'BEGIN { exit !(b < 0.65 * a) }' ||
      fail "activation peak $cp per rank at cp 2 vs $one at cp 1 (expected < 0.65x)"
    echo "ok: activation peak $one bytes at cp 1, $cp per rank at cp 2 ($(awk -v a="$one" -v b="$cp" 'BEGIN { printf "%.3f", b / a }')x)" ;;
  resume)
    run=("${common[@]}" --max_steps 4 --cp_size 2)
    mpi 2 "${run[@]}" --output_dir "$work/straight" >"$work/a.log" 2>&1 || { cat "$work/a.log"; fail "straight"; }
    mpi 2 "${run[@]}" --save_steps 2 --output_dir "$work/ckpt" >"$work/b.log" 2>&1 ||
      { cat "$work/b.log"; fail "with checkpoints"; }
    mkdir -p "$work/resumed" && cp -r "$work/ckpt/checkpoint-2" "$work/resumed/"
    mpi 2 "${run[@]}" --output_dir "$work/resumed" --resume_from_checkpoint latest >"$work/c.log" 2>&1 ||
      { cat "$work/c.log"; fail "resume"; }
    cmp "$work/straight/model.safetensors" "$work/resumed/model.safetensors" ||
      fail "resumed weights differ from the straight run"
    out=$(mpi 2 "${common[@]}" --max_steps 4 --output_dir "$work/resumed2" \
            --resume_from_checkpoint "$work/ckpt/checkpoint-2" 2>&1); rc=$?
    [ $rc -ne 0 ] || fail "resumed with cp_size 1 from a cp_size 2 checkpoint"
    echo "$out" | grep -q "was written with cp_size 2; this run has cp_size 1" ||
      { echo "$out"; fail "no one-line reason"; }
    echo "ok: resume at cp 2 is bit-exact; another cp_size refused" ;;
  estimate)
    est=("$bin" estimate --model_name_or_path "$src/tests/fixtures/trainer/tiny_config.json"
         --max_length 256 --per_device_train_batch_size 1)
    kib() { "${est[@]}" "$@" | awk '$1 == "activations" { v = $2; if ($3 == "MiB") v *= 1024; print v }'; }
    a1=$(kib) a2=$(kib --cp_size 2) a4=$(kib --cp_size 4)
    awk -v a="$a1" -v b="$a2" -v c="$a4" 'BEGIN { exit !(a > 0 && b * 2 == a && c * 4 == a) }' ||
      fail "activations $a1 / $a2 / $a4 KiB at cp 1 / 2 / 4 (expected 1 : 1/2 : 1/4)"
    "${est[@]}" --cp_size 2 | grep -q "256 tokens per micro-batch (128 per rank, cp_size 2), per rank of 2" ||
      fail "no per-rank token line"
    # The budget between the peaks at cp 2 (1.27 MiB) and cp 1 (2.04 MiB): cp_size 2.
    out=$("${est[@]}" --budget_gib 0.00125) || fail "estimate --budget_gib"
    [ "$(echo "$out" | grep -c "^context parallelism")" -eq 1 ] || { echo "$out"; fail "no one-line cp advice"; }
    echo "$out" | grep -q "context parallelism for 256-token sequences: --cp_size 2 fits" ||
      { echo "$out"; fail "cp_size 2 not recommended"; }
    "${est[@]}" --budget_gib 0.0000001 | grep -q "no --cp_size up to 64 fits" || fail "impossible budget"
    "${est[@]}" --cp_size 2 --world_size 3 >/dev/null 2>"$work/err" && fail "world_size 3 with cp 2"
    grep -q "option cp_size 2: the world size 3 must be a multiple" "$work/err" || fail "no reason"
    echo "ok: estimate activations ${a1} / ${a2} / ${a4} KiB at cp 1 / 2 / 4; $(echo "$out" | grep "^context")" ;;
  refusals)
    expect2() {  # expect2 PATTERN CMD...: exit 2 with PATTERN in a one-line message
      local pat=$1; shift
      "$@" >"$work/out" 2>"$work/err"; rc=$?
      [ $rc -eq 2 ] || { cat "$work/err"; fail "exit $rc: $*"; }
      grep -q -- "$pat" "$work/err" || { cat "$work/err"; fail "no line with '$pat'"; }
      [ "$(wc -l <"$work/err")" -eq 1 ] || { cat "$work/err"; fail "not one line: $*"; }
    }
    expect2 "option cp_size 2: the world size 1 must be a multiple" "$bin" "${common[@]}" \
      --cp_size 2 --output_dir "$work/x"
    expect2 "option pad_to_multiple_of 6: must be a multiple of 2 x cp_size = 4" "$bin" \
      "${common[@]}" --cp_size 2 --pad_to_multiple_of 6 --output_dir "$work/x"
    out=$(mpi 3 "${common[@]}" --cp_size 2 --output_dir "$work/x" 2>&1); rc=$?
    [ $rc -ne 0 ] || fail "3 ranks accepted with cp_size 2"
    echo "$out" | grep -q "option cp_size 2: the world size 3 must be a multiple" ||
      { echo "$out"; fail "no one-line reason on 3 ranks"; }
    out=$(mpi 2 reward --max_steps 1 --cp_size 2 --save_steps 0 --output_dir "$work/d" 2>&1); rc=$?
    [ $rc -ne 0 ] || fail "reward accepted cp_size 2"
    echo "$out" | grep -q "option cp_size 2: this trainer does not split sequences" ||
      { echo "$out"; fail "no one-line reason for reward"; }
    echo "ok: refusals" ;;
  *) fail "unknown case $case" ;;
esac
