#!/bin/bash
# Data-parallel SFT under mpirun against the single-process run with the same global batch
# (tests/dist/data_parallel.cmake). Usage: data_parallel.sh TRAINER_BIN MPIRUN CASE
#   CASE = z<stage>_<full|lora>_np<N>   --zero_stage 0..3 on N ranks x 1 micro-batch vs 1 rank
#          x N micro-batches, on a tiny model whose sizes are not multiples of 4 (hidden 42,
#          intermediate 197, vocab 577: every ZeRO unit is padded on 4 ranks; stage 3 keeps the
#          norms whole and shards the rest). --deterministic_comm: losses and final weights bit-identical;
#          without it: losses within 1e-5 relative. Stages 1 and 2: the optimizer-state bytes of
#          rank 0 (allocator tag, metrics.jsonl) are 1/N of the single process's, within 2%;
#          stage 2 (small units): the gradient peak is below the single process's; stage 3 (every
#          parameter sharded): the parameter peak is below the single process's.
#          np 1: one rank under mpirun with the option equals the plain run, bit for bit.
#   CASE = accum_z<stage>   2 ranks x 2 micro-batches vs 1 rank x 4: losses within 1e-5.
#   CASE = ga2_z<stage>_<full|lora>_np<N>   N ranks x 2 micro-batches vs 1 rank x 2N on the same
#          tiny model under --deterministic_comm: losses and final weights bit-identical (the
#          gradients are summed after every micro-batch, folded onto the running sum in one
#          process's order), and within 1e-5 relative without it; stage 3: this rank's slices
#          are 1/N of the sharded parameters, padding aside.
#   CASE = online_<grpo|rloo|online_dpo>  2 ranks x half the completions vs 1 rank: rewards and
#          gradient norms agree.
#   CASE = online_distill, online_judge  trainer_bin distill's demo and online_dpo with a --judge
#          command, 2 ranks x half the batch vs 1 rank: step 1's loss, entropy or
#          judge/no_verdict and gradient norm agree.
#   CASE = ds3_generation  trainer_bin grpo under zero_stage 3 on 2 ranks, with and without
#          ds3_gather_for_generation: the same completions (rewards, lengths, losses, KL and
#          gradient norms equal at every step), and fewer parameter bytes gathered at once without.
#   CASE = resume_z<stage>  a run stopped at a checkpoint and resumed on the same ranks is
#          bit-identical to the straight run; stage 3: saving gathers no more at once than not.
#   CASE = z3_offload  stage 3 with activation offloading and gradient checkpointing, and without
#          prefetch (--stage3_prefetch_bucket_size 0), bit-identical to one process. (The z3 cases
#          prefetch, and check that units were.)
#   CASE = z3_qlora  stage 3 with a 4-bit (NF4), then an 8-bit base and LoRA on 2 ranks, on the
#          odd tiny model (its weights are no multiple of NF4's 64-element blocks) made deeper and
#          wider, with a tied embedding: the packed codes and quant state are sharded and gathered
#          like any frozen group; losses and the adapter bit-identical to 1 rank x 2, and the
#          parameter peak below the single process's; a resumed checkpoint continues bit for bit.
#   CASE = resume_any  a 2-rank ZeRO checkpoint, consolidated (trainer_bin consolidate), resumes
#          on 1 rank, on 4 ranks under zero_stage 0, 2 and 3, and on 3 ranks: with the same
#          global batch, bit-identical to the straight run under --deterministic_comm.
#   CASE = tokens_z3, tokens_z3_tied  stage 3 with --trainable_token_indices (untied and
#          tied embeddings), bit-identical to one process.
#   CASE = model_only_z2  --save_only_model on 2 ranks (zero_stage 2): no optimizer state in the
#          checkpoint, the run unchanged by saving it, a resume refused.
#   CASE = eval_<grpo|online_dpo>  --eval_dataset with --eval_on_start on 2 ranks with half the
#          evaluation batch each against one process with the whole batch (8 prompts: no batch
#          padded): the same completions, so the same eval reward (within 1e-9) and eval loss
#          (within 1e-6 relative).
#   CASE = best_z3  --load_best_model_at_end on 2 ranks under zero_stage 3: the final model is the
#          best checkpoint's (each rank loads it whole and keeps its slices), not the last update's.
#   CASE = refusals  options data parallel does not support are refused in one line, exit 2.
# KEEP=1 in the environment keeps the case's work folder (its logs and outputs) for a look.
set -u
bin=$1 mpirun=$2 case=$3
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
mpi() { local np=$1; shift; timeout 250 "$mpirun" --oversubscribe --allow-run-as-root \
          --bind-to none -x OMP_NUM_THREADS -np "$np" "$bin" "$@"; }
common=(sft --max_steps 3 --per_device_train_batch_size 2 --logging_steps 1 --save_steps 0)
fail() { echo "FAIL: $*"; exit 1; }
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
# Relative agreement of two loss columns within $3.
close() {
  paste <(losses "$1") <(losses "$2") | awk -v tol="$3" '
    { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
      if (d > tol * m) { printf "step %d: %s vs %s\n", NR, $1, $2; bad = 1 } ; n++ }
    END { if (n == 0) { print "no losses"; exit 1 } exit bad }'
}
# Peak bytes of an allocator tag in the last metrics record (rank 0's).
tag_peak() { tail -1 "$1/metrics.jsonl" | grep -o "\"$2\":{[^}]*}" | grep -o '"peak":[0-9]*' | cut -d: -f2; }
weights() { [ -f "$1/adapter_model.safetensors" ] && echo "$1/adapter_model.safetensors" \
              || echo "$1/model.safetensors"; }
# The tiny model with awkward sizes (each argument, a sed expression, edits its config), and the
# demo's stories as its data.
src=$(cd "$(dirname "$0")/../.." && pwd)
odd_model() {
  cat >"$work/odd.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 42,
 "intermediate_size": 197, "num_hidden_layers": 4, "num_attention_heads": 3,
 "num_key_value_heads": 1, "head_dim": 14, "vocab_size": 577, "max_position_embeddings": 512,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", "initializer_range": 0.1}
JSON
  local e
  for e in "$@"; do sed -i "$e" "$work/odd.json"; done
  "$bin" init-model --model_config "$work/odd.json" --out "$work/odd" --seed 5 \
    --tokenizer "$src/data/embedded" >/dev/null || fail "init-model"
  odd=(--model_name_or_path "$work/odd" --dataset "$src/data/embedded/stories.jsonl" --max_length 128)
}
# "parameter slices 1.64 MiB (1719296 B)" and "whole small parameters ... (N B)" of a report.
report_bytes() { grep -o "$2 [0-9.]* [KMG]*i*B ([0-9]* B)" "$1" | head -1 | grep -o '([0-9]*' | tr -d '('; }

case $case in
  z*_np*)
    np=${case#*_np}
    stage=${case:1:1}
    kind=${case#*_}; kind=${kind%%_*}
    zero=(--zero_stage "$stage" --reduce_bucket_size 100000)
    [ "$stage" = 3 ] && zero+=(--stage3_param_persistence_threshold 100)
    odd_model
    extra=("${odd[@]}")
    # LoRA dropout draws from each rank's own stream, so its masks differ between world sizes
    # (as in torch DDP); the comparison runs without it.
    [ "$kind" = lora ] && extra+=(--use_peft --lora_dropout 0)
    "$bin" "${common[@]}" "${extra[@]}" --gradient_accumulation_steps "$np" --deterministic_comm \
      --output_dir "$work/one" >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
    mpi "$np" "${common[@]}" "${extra[@]}" "${zero[@]}" --deterministic_comm --output_dir "$work/dp" \
      >"$work/dp.log" 2>&1 || { cat "$work/dp.log"; fail "$np ranks"; }
    cmp <(losses "$work/one") <(losses "$work/dp") || fail "losses differ under --deterministic_comm"
    cmp "$(weights "$work/one")" "$(weights "$work/dp")" || fail "final weights differ"
    mpi "$np" "${common[@]}" "${extra[@]}" "${zero[@]}" --output_dir "$work/lib" >"$work/lib.log" 2>&1 ||
      { cat "$work/lib.log"; fail "$np ranks without --deterministic_comm"; }
    close "$work/one" "$work/lib" 1e-5 || fail "losses beyond 1e-5 relative"
    if [ "$np" = 1 ]; then  # one rank under mpirun: every stage is the plain optimizer
      echo "ok: 1 rank under mpirun (zero $stage, $kind) == 1 rank"
      exit 0
    fi
    if [ "$stage" != 0 ]; then
      one=$(tag_peak "$work/one" optimizer) dp=$(tag_peak "$work/dp" optimizer)
      # Within 2%, or within the allocator's 512-byte rounding of each piece's two moments.
      awk -v a="$one" -v b="$dp" -v n="$np" 'BEGIN { r = b * n / a; d = b * n - a;
        exit !((r >= 0.999 && r <= 1.02) || (d <= n * 8192 && d >= -n * 8192)) }' ||
        fail "optimizer bytes: $dp on rank 0 vs $one on one rank (expected 1/$np)"
      echo "optimizer-state bytes: $one on 1 rank, $dp on each of $np"
    fi
    # The step-time breakdown of every rank's report (compute / communication / exposed).
    grep -Eq "data parallel: $np ranks \(mpi, zero_stage $stage\), per update [0-9.]+ ms: compute [0-9.]+ ms, communication [0-9.]+ ms, exposed" "$work/dp.log" ||
      { cat "$work/dp.log"; fail "no step-time breakdown"; }
    if [ "$stage" = 2 ] && [ "$kind" = full ]; then  # LoRA adapters fit in one unit
      one=$(tag_peak "$work/one" grad) dp=$(tag_peak "$work/dp" grad)
      [ "$dp" -lt "$one" ] || fail "stage 2 gradient peak $dp not below $one"
      echo "gradient peak: $one on 1 rank, $dp per rank"
    fi
    if [ "$stage" = 3 ]; then
      one=$(tag_peak "$work/one" param) dp=$(tag_peak "$work/dp" param)
      [ "$dp" -lt "$one" ] || fail "stage 3 parameter peak $dp not below $one"
      grep -q "zero_stage 3: this rank's parameter slices" "$work/dp.log" ||
        { cat "$work/dp.log"; fail "no zero_stage 3 line in the memory report"; }
      # From the second pass on, every gather but the first of a pass was started ahead.
      grep -Eq "[1-9][0-9]* units prefetched \(0 unused\)" "$work/dp.log" ||
        { cat "$work/dp.log"; fail "no unit prefetched"; }
      echo "parameter peak: $one on 1 rank, $dp per rank"
    fi
    echo "ok: $np ranks (zero $stage, $kind) == 1 rank x $np micro-batches ($(losses "$work/dp" | tr '\n' ' '))" ;;
  z3_offload)
    # Stage 3 with activation offloading and gradient checkpointing: the offloader moves every
    # saved activation but the sharded weights, which are gathered again in backward.
    techniques=(--activation_offloading --gradient_checkpointing)
    "$bin" "${common[@]}" "${techniques[@]}" --gradient_accumulation_steps 2 --deterministic_comm \
      --output_dir "$work/one" >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
    mpi 2 "${common[@]}" "${techniques[@]}" --zero_stage 3 --stage3_param_persistence_threshold 0 \
      --stage3_prefetch_bucket_size 0 --deterministic_comm --output_dir "$work/dp" >"$work/dp.log" 2>&1 ||
      { cat "$work/dp.log"; fail "2 ranks"; }
    cmp <(losses "$work/one") <(losses "$work/dp") || fail "losses differ"
    cmp "$work/one/model.safetensors" "$work/dp/model.safetensors" || fail "final weights differ"
    grep -q "activation offloading: up to" "$work/dp.log" || fail "nothing offloaded"
    grep -q " 0 units prefetched" "$work/dp.log" || fail "prefetched with --stage3_prefetch_bucket_size 0"
    echo "ok: zero 3 + offloading + checkpointing on 2 ranks == 1 rank x 2" ;;
  z3_qlora)
    # A rank's parameter peak is its slices plus the largest gathered unit, here the outer one
    # (the embedding, dense f32). For it to fall below one process's, the quantized layers must
    # outweigh that unit, which the odd model's 4 narrow layers and untied head do not.
    odd_model 's/"num_hidden_layers": 4/"num_hidden_layers": 8/' \
      's/"intermediate_size": 197/"intermediate_size": 389/' \
      's/"tie_word_embeddings": false/"tie_word_embeddings": true/'
    for quant in 4bit 8bit; do  # NF4 (u8 codes, u8 + f32 state) and int8 (i8 rows, f32 scales)
      qlora=("${odd[@]}" --use_peft --lora_dropout 0 --load_in_$quant)
      "$bin" "${common[@]}" "${qlora[@]}" --gradient_accumulation_steps 2 --deterministic_comm \
        --output_dir "$work/one$quant" >"$work/one$quant.log" 2>&1 ||
        { cat "$work/one$quant.log"; fail "$quant: 1 rank"; }
      mpi 2 "${common[@]}" "${qlora[@]}" --zero_stage 3 --stage3_param_persistence_threshold 100 \
        --deterministic_comm --output_dir "$work/dp$quant" >"$work/dp$quant.log" 2>&1 ||
        { cat "$work/dp$quant.log"; fail "$quant: 2 ranks"; }
      cmp <(losses "$work/one$quant") <(losses "$work/dp$quant") || fail "$quant: losses differ"
      # Under stage 3 a QLoRA run still writes the adapter only.
      out="$work/dp$quant"
      [ -f "$out/adapter_model.safetensors" ] && [ ! -e "$out/model.safetensors" ] ||
        fail "$quant: no adapter alone in the output"
      cmp "$work/one$quant/adapter_model.safetensors" "$work/dp$quant/adapter_model.safetensors" ||
        fail "$quant: adapters differ"
      one=$(tag_peak "$work/one$quant" param) dp=$(tag_peak "$work/dp$quant" param)
      [ "$dp" -lt "$one" ] || fail "$quant: stage 3 parameter peak $dp not below $one"
      echo "$quant parameter peak: $one on 1 rank, $dp per rank"
      echo "ok: zero 3 + $quant base + LoRA on 2 ranks == 1 rank x 2" \
        "($(losses "$work/dp$quant" | tr '\n' ' '))"
    done
    # Its checkpoint (the adapter and the optimizer shards) resumes bit for bit.
    run=(sft --max_steps 4 --per_device_train_batch_size 2 --logging_steps 1 "${odd[@]}" --use_peft
         --lora_dropout 0 --load_in_4bit --zero_stage 3 --stage3_param_persistence_threshold 100)
    mpi 2 "${run[@]}" --save_steps 2 --output_dir "$work/ckpt" >"$work/ckpt.log" 2>&1 ||
      { cat "$work/ckpt.log"; fail "run with checkpoints"; }
    [ ! -e "$work/ckpt/checkpoint-2/model.safetensors" ] || fail "the whole model in a checkpoint"
    # The adapter is whole on every rank: saving it gathers nothing, so the run with a checkpoint
    # gathers no more at once than the run without.
    a=$(report_bytes "$work/dp4bit.log" "gathered units at most")
    b=$(report_bytes "$work/ckpt.log" "gathered units at most")
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "gathered at most $b B with a save, $a B without"
    mkdir -p "$work/resumed" && cp -r "$work/ckpt/checkpoint-2" "$work/resumed/"
    mpi 2 "${run[@]}" --save_steps 0 --output_dir "$work/resumed" --resume_from_checkpoint latest \
      >"$work/resumed.log" 2>&1 || { cat "$work/resumed.log"; fail "resume"; }
    cmp "$work/ckpt/adapter_model.safetensors" "$work/resumed/adapter_model.safetensors" ||
      fail "the resumed adapter differs from the straight run's"
    c=$(report_bytes "$work/resumed.log" "gathered units at most")
    [ "$a" = "$c" ] || fail "gathered at most $c B with a resume, $a B without"
    echo "ok: zero 3 + QLoRA resumed from checkpoint-2 is bit-exact" ;;
  ga2_z*)
    spec=${case#ga2_z}; stage=${spec%%_*}; kind=${spec#*_}; kind=${kind%%_*}; np=${case##*_np}
    odd_model
    extra=("${odd[@]}")
    [ "$kind" = lora ] && extra+=(--use_peft --lora_dropout 0)
    zero=(--zero_stage "$stage")
    [ "$stage" = 3 ] && zero+=(--stage3_param_persistence_threshold 100)
    "$bin" "${common[@]}" "${extra[@]}" --gradient_accumulation_steps $((2 * np)) \
      --output_dir "$work/one" >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
    mpi "$np" "${common[@]}" "${extra[@]}" "${zero[@]}" --gradient_accumulation_steps 2 \
      --deterministic_comm --output_dir "$work/dp" >"$work/dp.log" 2>&1 ||
      { cat "$work/dp.log"; fail "$np ranks"; }
    cmp <(losses "$work/one") <(losses "$work/dp") || fail "losses differ under --deterministic_comm"
    cmp "$(weights "$work/one")" "$(weights "$work/dp")" || fail "final weights differ"
    mpi "$np" "${common[@]}" "${extra[@]}" "${zero[@]}" --gradient_accumulation_steps 2 \
      --output_dir "$work/lib" >"$work/lib.log" 2>&1 || { cat "$work/lib.log"; fail "$np ranks"; }
    close "$work/one" "$work/lib" 1e-5 || fail "losses beyond 1e-5 relative without --deterministic_comm"
    if [ "$stage" = 3 ] && [ "$kind" = full ] && [ "$np" != 1 ]; then
      # The model's weight bytes (model.safetensors less its header) less what stays whole (the
      # norms), over N: this rank's slices, plus at most N - 1 padding elements per group (5
      # groups). (Under LoRA the adapters stay whole too, and are not model parameters.)
      f="$work/one/model.safetensors"
      header=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
      one=$(( $(stat -c %s "$f") - 8 - header ))
      slices=$(report_bytes "$work/dp.log" "parameter slices")
      whole=$(report_bytes "$work/dp.log" "whole small parameters")
      [ -n "$slices" ] && [ -n "$whole" ] || { cat "$work/dp.log"; fail "no zero_stage 3 line"; }
      awk -v o="$one" -v s="$slices" -v w="$whole" -v n="$np" 'BEGIN {
        d = s * n - (o - w); exit !(d >= 0 && d < 5 * n * 4) }' ||
        fail "parameter slices $slices B on each of $np ranks for $one B ($whole B whole)"
      echo "parameter bytes: $one on 1 rank; $slices B of slices + $whole B whole per rank"
    fi
    echo "ok: $np ranks x 2 micro-batches (zero $stage, $kind) == 1 rank x $((2 * np)) bit for bit" ;;
  accum_z*)
    stage=${case#accum_z}
    "$bin" "${common[@]}" --gradient_accumulation_steps 4 --output_dir "$work/one" \
      >"$work/one.log" 2>&1 || fail "1 rank"
    z3=(); [ "$stage" = 3 ] && z3=(--stage3_param_persistence_threshold 0)
    mpi 2 "${common[@]}" --zero_stage "$stage" "${z3[@]}" --gradient_accumulation_steps 2 --output_dir "$work/dp" \
      >"$work/dp.log" 2>&1 || { cat "$work/dp.log"; fail "2 ranks"; }
    close "$work/one" "$work/dp" 1e-5 || fail "losses beyond 1e-5 relative"
    echo "ok: 2 ranks x 2 (zero $stage) == 1 rank x 4 within 1e-5" ;;
  model_only_z2)
    # --save_only_model on 2 ranks under zero_stage 2: the checkpoint holds the model but no
    # optimizer state (neither the whole file nor any rank's shard), saving it does not change
    # the run (its weights equal a run that never saved), and a resume is refused in one line.
    run=(sft --max_steps 4 --per_device_train_batch_size 2 --logging_steps 1 --zero_stage 2)
    mpi 2 "${run[@]}" --save_steps 0 --output_dir "$work/straight" >"$work/a.log" 2>&1 ||
      { cat "$work/a.log"; fail "straight run"; }
    mpi 2 "${run[@]}" --save_steps 2 --save_only_model --output_dir "$work/ckpt" \
      >"$work/b.log" 2>&1 || { cat "$work/b.log"; fail "run with model-only checkpoints"; }
    ck=$work/ckpt/checkpoint-2
    [ -f "$ck/model.safetensors" ] && [ -f "$ck/rank_1.json" ] || fail "incomplete checkpoint"
    ls "$ck" | grep -q optimizer && fail "a model-only checkpoint holds optimizer state: $(ls "$ck")"
    grep -q '"save_only_model": true' "$ck/leantune_state.json" || fail "not marked save_only_model"
    cmp "$work/straight/model.safetensors" "$work/ckpt/model.safetensors" ||
      fail "model-only saves changed the run"
    mpi 2 "${run[@]}" --save_steps 0 --output_dir "$work/ckpt" --resume_from_checkpoint latest \
      >"$work/c.log" 2>&1 && fail "resumed from a model-only checkpoint"
    grep -q "was saved with save_only_model" "$work/c.log" || { cat "$work/c.log"; fail "message"; }
    echo "ok: model-only checkpoint on 2 ranks, no optimizer state, resume refused"
    ;;
  eval_*)
    cmd=${case#eval_}
    for a in 1 2 3 4 5 6 7 8; do echo "{\"prompt\": \"Add $a and 2.\", \"answer\": \"$((a + 2))\"}"; done \
      >"$work/eval.jsonl"
    per=16; [ "$cmd" = online_dpo ] && per=2
    run=("$cmd" --device cpu --max_steps 1 --logging_steps 1 --save_steps 0 --eval_on_start
         --eval_dataset "$work/eval.jsonl" --reward_funcs ''
         --reward_command "bash $src/tests/fixtures/online/length_reward.sh")
    "$bin" "${run[@]}" --per_device_eval_batch_size $((2 * per)) --output_dir "$work/one" \
      >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
    mpi 2 "${run[@]}" --per_device_eval_batch_size "$per" --output_dir "$work/dp" \
      >"$work/dp.log" 2>&1 || { cat "$work/dp.log"; fail "2 ranks"; }
    first() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | head -1 | cut -d: -f2; }
    key=eval_reward; [ "$cmd" = online_dpo ] && key=eval_objective/scores
    for k in "$key" eval_loss; do
      a=$(first "$work/one" "$k") b=$(first "$work/dp" "$k")
      [ -n "$a" ] && [ -n "$b" ] || fail "$cmd: no $k ($a, $b)"
      awk -v a="$a" -v b="$b" -v k="$k" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a;
        tol = k == "eval_loss" ? 1e-6 * m + 1e-9 : 1e-9; exit d > tol }' ||
        fail "$cmd: $k $a on 1 rank vs $b on 2"
    done
    echo "ok: $cmd evaluation on 2 ranks equals one process's ($key $(first "$work/dp" "$key"), eval_loss $(first "$work/dp" eval_loss))"
    ;;
  best_z3)
    # The largest eval loss is the best here (greater_is_better): the first evaluation's, at step
    # 2, as the loss falls; its checkpoint's weights become the final model.
    for _ in 1 2 3 4; do echo '{"text": "One day, a cat sat on the mat. It was happy. The end."}'; done \
      >"$work/eval.jsonl"
    run=(sft --max_steps 4 --per_device_train_batch_size 2 --logging_steps 1 --zero_stage 3
         --stage3_param_persistence_threshold 0 --learning_rate 1e-3 --eval_dataset "$work/eval.jsonl"
         --eval_steps 2 --save_steps 2 --load_best_model_at_end --greater_is_better true)
    mpi 2 "${run[@]}" --output_dir "$work/best" >"$work/a.log" 2>&1 ||
      { cat "$work/a.log"; fail "run with load_best_model_at_end"; }
    grep -q "loaded the best model, $work/best/checkpoint-2" "$work/a.log" ||
      { cat "$work/a.log"; fail "the best checkpoint was not loaded"; }
    cmp "$work/best/model.safetensors" "$work/best/checkpoint-2/model.safetensors" ||
      fail "the final model is not the best checkpoint's"
    cmp -s "$work/best/model.safetensors" "$work/best/checkpoint-4/model.safetensors" &&
      fail "the last checkpoint equals the best: the test shows nothing"
    echo "ok: zero 3 on 2 ranks, the final model is checkpoint-2's (the best eval loss)"
    ;;
  resume_z*)
    # A run stopped at a checkpoint and resumed on the same ranks ends bit-identical to the run
    # that never stopped; another world size is refused in one line.
    stage=${case#resume_z}
    run=(sft --max_steps 4 --per_device_train_batch_size 2 --logging_steps 1 --zero_stage "$stage")
    [ "$stage" = 3 ] && run+=(--stage3_param_persistence_threshold 0)
    mpi 2 "${run[@]}" --save_steps 0 --output_dir "$work/straight" >"$work/a.log" 2>&1 ||
      { cat "$work/a.log"; fail "straight run"; }
    mpi 2 "${run[@]}" --save_steps 2 --output_dir "$work/ckpt" >"$work/b.log" 2>&1 ||
      { cat "$work/b.log"; fail "run with checkpoints"; }
    [ -f "$work/ckpt/checkpoint-2/rank_1.json" ] || fail "no rank_1.json in the checkpoint"
    if [ "$stage" = 3 ]; then
      # A save gathers one unit at a time for rank 0: no more parameter bytes at once than a
      # run that never saves.
      a=$(report_bytes "$work/a.log" "gathered units at most")
      b=$(report_bytes "$work/b.log" "gathered units at most")
      [ -n "$a" ] && [ "$a" = "$b" ] || fail "gathered at most $b B with saves, $a B without"
    fi
    if [ "$stage" != 0 ]; then
      [ -f "$work/ckpt/checkpoint-2/optimizer_rank_1.safetensors" ] || fail "no optimizer shard"
    fi
    mkdir -p "$work/resumed" && cp -r "$work/ckpt/checkpoint-2" "$work/resumed/"
    mpi 2 "${run[@]}" --save_steps 0 --output_dir "$work/resumed" \
      --resume_from_checkpoint latest >"$work/c.log" 2>&1 || { cat "$work/c.log"; fail "resume"; }
    cmp "$work/straight/model.safetensors" "$work/resumed/model.safetensors" ||
      fail "resumed weights differ from the straight run"
    # The checkpoint's model, consolidated, is the single-process run's at the same step.
    "$bin" consolidate "$work/ckpt/checkpoint-2" --out "$work/export" >/dev/null ||
      fail "consolidate"
    "$bin" "${run[@]}" --gradient_accumulation_steps 2 --save_steps 2 \
      --deterministic_comm --output_dir "$work/single" >"$work/d.log" 2>&1 || fail "1 rank"
    mpi 2 "${run[@]}" --save_steps 2 --deterministic_comm --output_dir "$work/det" \
      >"$work/e.log" 2>&1 || { cat "$work/e.log"; fail "deterministic run with checkpoints"; }
    "$bin" consolidate "$work/det/checkpoint-2" --out "$work/det_export" >/dev/null ||
      fail "consolidate"
    [ ! -e "$work/det_export/rank_1.json" ] || fail "training state copied into the export"
    cmp "$work/single/checkpoint-2/model.safetensors" "$work/det_export/model.safetensors" ||
      fail "consolidated weights differ from the single-process run"
    out=$(mpi 4 "${run[@]}" --save_steps 0 --output_dir "$work/resumed" \
            --resume_from_checkpoint "$work/ckpt/checkpoint-2" 2>&1); rc=$?
    [ $rc -ne 0 ] || fail "resumed on 4 ranks from a 2-rank checkpoint"
    echo "$out" | grep -q "written by 2 rank(s)" || { echo "$out"; fail "no one-line reason"; }
    echo "ok: resume on 2 ranks (zero $stage) is bit-exact" ;;
  resume_any)
    # A checkpoint of 2 ranks x 2 micro-batches (zero_stage 2), consolidated, resumes on 1 rank x 4
    # and on 4 ranks x 1 under zero_stage 2, 3 and 0: the same global batch, so under
    # --deterministic_comm each continuation ends with the straight run's losses and weights bit
    # for bit. A zero_stage 3 checkpoint, consolidated, resumes on 1 rank bit for bit. On 3 ranks
    # the position (8 micro-batches) falls mid-round: the log says how the ranks start. The raw
    # sharded checkpoint on 4 ranks is refused in one line that names consolidate.
    run=(sft --max_steps 4 --per_device_train_batch_size 2 --logging_steps 1 --deterministic_comm)
    tail2() { losses "$1" | tail -2; }
    for stage in 2 3; do
      z=(--zero_stage "$stage"); [ "$stage" = 3 ] && z+=(--stage3_param_persistence_threshold 0)
      mpi 2 "${run[@]}" "${z[@]}" --gradient_accumulation_steps 2 --save_steps 2 \
        --output_dir "$work/two_z$stage" >"$work/two_z$stage.log" 2>&1 ||
        { cat "$work/two_z$stage.log"; fail "2 ranks, zero $stage"; }
      "$bin" consolidate "$work/two_z$stage/checkpoint-2" --out "$work/c_z$stage" \
        >"$work/cons_z$stage.log" 2>&1 || { cat "$work/cons_z$stage.log"; fail "consolidate"; }
      grep -q "optimizer merged from 2 shards" "$work/cons_z$stage.log" ||
        { cat "$work/cons_z$stage.log"; fail "zero $stage: optimizer shards not merged"; }
      for f in optimizer.safetensors leantune_state.json trainer_state.json checkpoint_complete; do
        [ -f "$work/c_z$stage/$f" ] || fail "zero $stage: no $f in the consolidated checkpoint"
      done
      [ ! -e "$work/c_z$stage/rank_1.json" ] && [ ! -e "$work/c_z$stage/optimizer_rank_0.safetensors" ] ||
        fail "zero $stage: per-rank files in the consolidated checkpoint"
      grep -q '"consolidated_from": 2' "$work/c_z$stage/leantune_state.json" ||
        fail "zero $stage: leantune_state.json does not say consolidated_from"
      "$bin" "${run[@]}" --gradient_accumulation_steps 4 --save_steps 0 --output_dir "$work/one_z$stage" \
        --resume_from_checkpoint "$work/c_z$stage" >"$work/one_z$stage.log" 2>&1 ||
        { cat "$work/one_z$stage.log"; fail "zero $stage checkpoint resumed on 1 rank"; }
      grep -q "consolidated from 2 rank(s)) resumed on 1 rank(s)" "$work/one_z$stage.log" ||
        { cat "$work/one_z$stage.log"; fail "no resume line in the log"; }
      [ "$(tail2 "$work/two_z$stage")" = "$(tail2 "$work/one_z$stage")" ] ||
        fail "zero $stage checkpoint on 1 rank: losses $(tail2 "$work/one_z$stage" | tr '\n' ' ')" \
          "vs $(tail2 "$work/two_z$stage" | tr '\n' ' ')"
      cmp "$work/two_z$stage/model.safetensors" "$work/one_z$stage/model.safetensors" ||
        fail "zero $stage checkpoint on 1 rank: final weights differ from the straight run"
      echo "ok: zero $stage checkpoint of 2 ranks, consolidated, on 1 rank x 4 == 2 ranks x 2"
    done
    for to in 2 3 0; do
      z=(--zero_stage "$to"); [ "$to" = 3 ] && z+=(--stage3_param_persistence_threshold 0)
      mpi 4 "${run[@]}" "${z[@]}" --save_steps 0 --output_dir "$work/four_z$to" \
        --resume_from_checkpoint "$work/c_z2" >"$work/four_z$to.log" 2>&1 ||
        { cat "$work/four_z$to.log"; fail "resume on 4 ranks, zero $to"; }
      [ "$(tail2 "$work/two_z2")" = "$(tail2 "$work/four_z$to")" ] ||
        fail "4 ranks, zero $to: losses $(tail2 "$work/four_z$to" | tr '\n' ' ')" \
          "vs $(tail2 "$work/two_z2" | tr '\n' ' ')"
      cmp "$work/two_z2/model.safetensors" "$work/four_z$to/model.safetensors" ||
        fail "4 ranks, zero $to: final weights differ from the straight run"
      echo "ok: zero 2 checkpoint of 2 ranks, consolidated, on 4 ranks x 1 (zero $to) == 2 ranks x 2"
    done
    mpi 3 "${run[@]}" --zero_stage 1 --save_steps 0 --output_dir "$work/three" \
      --resume_from_checkpoint "$work/c_z2" >"$work/three.log" 2>&1 ||
      { cat "$work/three.log"; fail "resume on 3 ranks"; }
    grep -q "global micro-batch 8 of epoch 0 is not a multiple of 3 ranks; ranks 0..1 start one step further" \
      "$work/three.log" || { cat "$work/three.log"; fail "3 ranks: no data position line"; }
    out=$(mpi 4 "${run[@]}" --zero_stage 2 --save_steps 0 --output_dir "$work/refused" \
            --resume_from_checkpoint "$work/two_z2/checkpoint-2" 2>&1); rc=$?
    [ $rc -ne 0 ] || fail "a 2-rank sharded checkpoint resumed on 4 ranks"
    echo "$out" | grep -q "written by 2 rank(s).*trainer_bin consolidate" ||
      { echo "$out"; fail "no one-line reason naming consolidate"; }
    echo "ok: consolidated checkpoints resume on 1, 3 and 4 ranks, any zero_stage" ;;
  dpo_z*|kto_z*)
    # trainer_bin dpo and kto shard their micro-batches over the ranks like sft: 2 ranks x 1
    # micro-batch equal 1 rank x 2 under --deterministic_comm.
    # (kto's KL estimate is the ranks' mean, as TRL gathers it, not each micro-batch's: that
    # comparison runs apo_zero_unpaired, which has no KL term.)
    cmd=${case%%_z*}
    stage=${case#*_z}
    extra=(); [ "$cmd" = kto ] && extra=(--loss_type apo_zero_unpaired)
    run=("$cmd" "${extra[@]}" --max_steps 3 --per_device_train_batch_size 2 --logging_steps 1 --save_steps 0
         --deterministic_comm)
    "$bin" "${run[@]}" --gradient_accumulation_steps 2 --output_dir "$work/one" \
      >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
    mpi 2 "${run[@]}" --zero_stage "$stage" --output_dir "$work/dp" >"$work/dp.log" 2>&1 ||
      { cat "$work/dp.log"; fail "2 ranks"; }
    cmp <(losses "$work/one") <(losses "$work/dp") || fail "$cmd losses differ"
    cmp "$(weights "$work/one")" "$(weights "$work/dp")" || fail "$cmd weights differ"
    echo "ok: $cmd on 2 ranks (zero $stage) == 1 rank x 2 ($(losses "$work/dp" | tr '\n' ' '))" ;;
  lost_rank_*)
    # A training rank that dies (SIGKILL) or stops answering (SIGSTOP) mid-run ends the whole
    # job non-zero within --comm_timeout, with a message naming rank 1.
    sig=${case#lost_rank_}
    mpi 2 sft --max_steps 100000 --per_device_train_batch_size 2 --logging_steps 1 \
      --save_steps 0 --comm_timeout 4 --output_dir "$work/lost" >"$work/lost.log" 2>&1 &
    job=$!
    pid=""
    for _ in $(seq 1 200); do  # rank 1's process, once it has trained a step
      if grep -q '"step":2' "$work/lost/metrics.jsonl" 2>/dev/null; then
        for p in $(pgrep -f "trainer_bin sft --max_steps 100000"); do
          if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" &&
             grep -q "$work/lost" /proc/$p/cmdline 2>/dev/null; then pid=$p; fi
        done
        [ -n "$pid" ] && break
      fi
      sleep 0.1
    done
    [ -n "$pid" ] || { kill $job; cat "$work/lost.log"; fail "rank 1 never started training"; }
    start=$(date +%s)
    kill -"$sig" "$pid"
    wait $job; rc=$?
    elapsed=$(( $(date +%s) - start ))
    kill -KILL "$pid" 2>/dev/null
    [ $rc -ne 0 ] || fail "the job exited 0 after rank 1 was sent SIG$sig"
    [ $rc -ne 124 ] || fail "the job hung"
    [ $elapsed -le 60 ] || fail "the job took $elapsed s to end"
    grep -Eq "rank 1 lost|process rank 1" "$work/lost.log" || { cat "$work/lost.log"; fail "no line naming rank 1"; }
    echo "ok: SIG$sig to rank 1 ended the job (exit $rc) in $elapsed s: $(grep -Eo "rank 1 lost[^;]*|process rank 1[^.]*" "$work/lost.log" | head -1)" ;;
  online_distill|online_judge)
    # trainer_bin distill (its demo: the demo model teaches a fresh student) and online_dpo with
    # a --judge command, on 2 ranks with half the generation batch each against one process with
    # the whole batch: step 1 generates from the same weights, so the same completions. distill:
    # the loss (each rank's divergence over the whole batch's completion tokens, summed) and the
    # entropy (sums and token counts gathered, as TRL's gather_for_metrics) within 1e-6
    # relative. judge: the digit judge's verdicts do not depend on the order a rank shows a pair
    # in, so judge/no_verdict is equal and the loss within 1e-6. The gradient norm within 1e-4
    # relative (other sums, as online_*).
    if [ "$case" = online_distill ]; then
      run=(distill --device cpu --max_steps 2 --logging_steps 1 --save_steps 0)
      keys=(loss entropy); per=8
    else
      run=(online_dpo --device cpu --max_steps 2 --logging_steps 1 --save_steps 0
           --judge "bash $src/tests/fixtures/online/digit_judge.sh")
      keys=(loss judge/no_verdict); per=2
    fi
    "$bin" "${run[@]}" --per_device_train_batch_size $((2 * per)) --output_dir "$work/one" \
      >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
    mpi 2 "${run[@]}" --per_device_train_batch_size "$per" --output_dir "$work/dp" \
      >"$work/dp.log" 2>&1 || { cat "$work/dp.log"; fail "2 ranks"; }
    col() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2; }
    for k in "${keys[@]}" grad_norm; do
      tol=1e-6; [ "$k" = grad_norm ] && tol=1e-4
      for d in one dp; do
        col "$work/$d" "$k" | awk '$1 + 0 == $1 && $1 != "nan" { n++ } END { exit n != 2 }' ||
          fail "$case: $d: $k is not 2 finite values: $(col "$work/$d" "$k" | tr '\n' ' ')"
      done
      paste <(col "$work/one" "$k" | head -1) <(col "$work/dp" "$k" | head -1) | awk -v t="$tol" '
        { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
          if (d > t * m + 1e-12) { print "step 1: " $1 " vs " $2; exit 1 } }' ||
        fail "$case: $k differs between 1 and 2 ranks"
    done
    echo "ok: $case on 2 ranks == 1 rank at step 1 (${keys[0]} $(col "$work/dp" "${keys[0]}" | head -1)," \
      "${keys[1]} $(col "$work/dp" "${keys[1]}" | head -1))" ;;
  online_*)
    # trainer_bin grpo / rloo / online_dpo on 2 ranks with half the completions each against one
    # process with the whole generation batch: the same prompts and completion numbers (Philox
    # stream per completion), rewards gathered in rank order, each rank's loss over the world
    # size. Only the first step is compared: it generates from the same weights, so the
    # completions and their rewards are the same (within 1e-9) and the gradient norm agrees
    # within 1e-4 relative (the batches are scored in other compositions, so the sums round
    # differently). After an update the two layouts' weights differ in the last bits, a sampled
    # token can flip, and a discrete reward then differs by a whole step: whether it does depends
    # on the CPU's BLAS kernels, so later steps are only checked to exist and be finite.
    cmd=${case#online_}
    extra=(--beta 0.04); [ "$cmd" = online_dpo ] && extra=()
    per=16
    run=("$cmd" --device cpu "${extra[@]}" --max_steps 4 --logging_steps 1 --save_steps 0
         --reward_funcs '' --reward_command "bash $src/tests/fixtures/online/length_reward.sh")
    "$bin" "${run[@]}" --per_device_train_batch_size $((2 * per)) --output_dir "$work/one" \
      >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
    mpi 2 "${run[@]}" --per_device_train_batch_size "$per" --output_dir "$work/dp" \
      >"$work/dp.log" 2>&1 || { cat "$work/dp.log"; fail "2 ranks"; }
    key=reward; [ "$cmd" = online_dpo ] && key=objective/scores
    col() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2; }
    for k in "$key" grad_norm; do
      for d in one dp; do
        col "$work/$d" "$k" | awk '$1 + 0 == $1 && $1 != "nan" { n++ } END { exit n != 4 }' ||
          fail "$cmd: $d: $k is not 4 finite values: $(col "$work/$d" "$k" | tr '\n' ' ')"
      done
    done
    paste <(col "$work/one" "$key" | head -1) <(col "$work/dp" "$key" | head -1) | awk '
      { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-9) { print "step 1: " $1 " vs " $2; exit 1 } }' ||
      fail "$cmd: $key differs between 1 and 2 ranks"
    paste <(col "$work/one" grad_norm | head -1) <(col "$work/dp" grad_norm | head -1) | awk '
      { d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
        if (d > 1e-4 * m + 1e-12) { print "step 1: " $1 " vs " $2; exit 1 } }' ||
      fail "$cmd: grad_norm differs between 1 and 2 ranks"
    echo "ok: $cmd on 2 ranks == 1 rank at step 1 ($key $(col "$work/dp" "$key" | head -1))" ;;
  ds3_generation)
    run=(grpo --device cpu --beta 0.04 --max_steps 4 --logging_steps 1 --save_steps 0
         --per_device_train_batch_size 16 --zero_stage 3 --stage3_param_persistence_threshold 0)
    for g in true false; do
      mpi 2 "${run[@]}" --ds3_gather_for_generation "$g" --output_dir "$work/$g" \
        >"$work/$g.log" 2>&1 || { cat "$work/$g.log"; fail "ds3_gather_for_generation $g"; }
    done
    for key in reward completions/mean_length loss kl grad_norm; do
      col() { grep -o "\"$key\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2; }
      [ "$(col "$work/true" | wc -l)" = 4 ] || fail "no $key in the metrics"
      cmp <(col "$work/true") <(col "$work/false") || fail "$key differs between the gather modes"
    done
    gathered() {  # "gathered units at most 1.03 MiB" -> bytes
      grep -o "gathered units at most [0-9.]* [KMG]*i*B" "$1" | head -1 | awk '
        { v = $5; u = $6; if (u == "KiB") v *= 1024; if (u == "MiB") v *= 1048576;
          if (u == "GiB") v *= 1073741824; printf "%d\n", v }'
    }
    whole=$(gathered "$work/true.log") layers=$(gathered "$work/false.log")
    [ -n "$whole" ] && [ -n "$layers" ] && [ "$layers" -lt "$whole" ] ||
      fail "gathered at most $layers B layer by layer, $whole B whole"
    echo "ok: the same completions with and without ds3_gather_for_generation; gathered at most" \
      "$whole B (whole model) vs $layers B (layer by layer)" ;;
  tokens_z3|tokens_z3_tied)
    # Stage 3 with PEFT's trainable tokens (ids 10..109, frequent in the data, so the rows move):
    # the rows' delta stays whole (an adapter), the frozen embedding is sharded and gathered for
    # each lookup; bit-identical to one process. Tied: the head uses the embedding with the
    # listed rows replaced.
    tie=()
    [ "$case" = tokens_z3_tied ] && tie=('s/"tie_word_embeddings": false/"tie_word_embeddings": true/')
    odd_model "${tie[@]}"
    tokens=(--use_peft --lora_dropout 0 --trainable_token_indices "$(seq -s, 10 109)")
    "$bin" "${common[@]}" "${odd[@]}" "${tokens[@]}" --gradient_accumulation_steps 2 \
      --output_dir "$work/one" >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1 rank"; }
    mpi 2 "${common[@]}" "${odd[@]}" "${tokens[@]}" --zero_stage 3 \
      --stage3_param_persistence_threshold 100 --deterministic_comm --output_dir "$work/dp" \
      >"$work/dp.log" 2>&1 || { cat "$work/dp.log"; fail "2 ranks"; }
    cmp <(losses "$work/one") <(losses "$work/dp") || fail "losses differ under --deterministic_comm"
    cmp "$(weights "$work/one")" "$(weights "$work/dp")" || fail "final adapters differ"
    echo "ok: zero 3 + trainable tokens on 2 ranks == 1 rank x 2 ($(losses "$work/dp" | tr '\n' ' '))" ;;
  refusals)
    out=$(mpi 2 "${common[@]}" --optimizer_in_backward --max_grad_norm 0 \
            --output_dir "$work/x" 2>&1); rc=$?
    [ $rc -ne 0 ] || fail "optimizer_in_backward accepted under data parallel"
    echo "$out" | grep -q "optimizer_in_backward: not supported with data parallel" ||
      { echo "$out"; fail "no one-line reason"; }
    expect2() {  # expect2 PATTERN CMD...: exit 2 with PATTERN in the one-line message
      local pat=$1; shift
      out=$("$@" 2>&1); rc=$?
      [ $rc -ne 0 ] || fail "accepted: $*"
      echo "$out" | grep -q -- "$pat" || { echo "$out"; fail "no line with '$pat'"; }
    }
    expect2 "option comm_timeout" "$bin" "${common[@]}" --comm_timeout 0 --output_dir "$work/y"
    expect2 "optim adafactor" mpi 2 "${common[@]}" --zero_stage 1 --optim adafactor \
      --output_dir "$work/y"
    echo "ok: refusals" ;;
  *) fail "unknown case $case" ;;
esac
