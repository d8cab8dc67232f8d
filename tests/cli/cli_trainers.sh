#!/usr/bin/env bash
# CLI tests of trainer_bin's trainer commands: every invalid option exits 2 with exactly one
# line on stderr; --help exits 0; init-model followed by generate works from a clean build.
# usage: cli_trainers.sh TRAINER_BIN SOURCE_DIR
set -u
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

expect_exit2() {
  local what=$1
  shift
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ]; then
    echo "FAIL ($what): exit $rc, $lines stderr lines:"
    cat "$tmp/err"
    fail=1
  else
    echo "ok ($what): $(cat "$tmp/err")"
  fi
}

data=$src/tests/fixtures/trainer/stories_small.jsonl
expect_exit2 "unknown option" sft --max_lenght 10
expect_exit2 "ill-typed int" sft --max_length ten
expect_exit2 "ill-typed float" sft --learning_rate fast
expect_exit2 "bad bool" sft --packing maybe
expect_exit2 "bad choice" sft --packing_strategy best
expect_exit2 "out of range" sft --per_device_train_batch_size 0
expect_exit2 "negative lr" sft --learning_rate -1
expect_exit2 "missing value" sft --output_dir
expect_exit2 "model without data" sft --model_name_or_path "$tmp/none"
expect_exit2 "data without model" sft --dataset "$data"
expect_exit2 "missing model folder" sft --model_name_or_path "$tmp/none" --dataset "$data"
expect_exit2 "bad config file" sft --config "$tmp/missing.json"
echo '{"max_length": "x"}' >"$tmp/bad.json"
expect_exit2 "ill-typed config key" sft --config "$tmp/bad.json"
echo '{"not_an_option": 1}' >"$tmp/bad2.json"
expect_exit2 "unknown config key" sft --config "$tmp/bad2.json"
expect_exit2 "no steps" sft --num_train_epochs 0 --max_steps -1
expect_exit2 "bad device" sft --device gpu7
expect_exit2 "bad resume" sft --resume_from_checkpoint "$tmp/nope"
expect_exit2 "unknown command" frobnicate
expect_exit2 "init-model without out" init-model --config "$src/data/embedded/config.json"
expect_exit2 "generate without model" generate --prompt hi

"$bin" sft --help >"$tmp/help" 2>&1 || { echo "FAIL: sft --help"; fail=1; }
for opt in model_name_or_path dataset eval_dataset dataset_text_field output_dir max_length \
    truncation_mode packing packing_strategy padding_free pad_to_multiple_of completion_only_loss \
    assistant_only_loss chat_template per_device_train_batch_size gradient_accumulation_steps \
    learning_rate lr_scheduler_type warmup_steps weight_decay adam_beta1 adam_beta2 \
    adam_epsilon max_grad_norm num_train_epochs max_steps logging_steps eval_steps save_steps \
    save_total_limit seed bf16 gradient_checkpointing device resume_from_checkpoint; do
  grep -q -- "--$opt (" "$tmp/help" || { echo "FAIL: sft --help lacks --$opt"; fail=1; }
done
# TRL's and transformers' other names, listed beside the option they set.
for alias in warmup_ratio dataset_name; do
  grep -q -- "also --$alias" "$tmp/help" || { echo "FAIL: sft --help lacks --$alias"; fail=1; }
done

"$bin" init-model --config "$src/data/embedded/config.json" --out "$tmp/model" --seed 3 \
    --tokenizer "$src/data/embedded" >"$tmp/out" 2>&1 || { echo "FAIL: init-model"; cat "$tmp/out"; fail=1; }
"$bin" generate --model "$tmp/model" --prompt "One sunny day," --max_new_tokens 8 --device cpu \
    >"$tmp/gen" 2>&1 || { echo "FAIL: generate"; cat "$tmp/gen"; fail=1; }
"$bin" generate --model "$tmp/model" --prompt "Hi" --chat --max_new_tokens 4 --temperature 0.8 \
    --top_p 0.9 --seed 1 --device cpu >"$tmp/gen2" 2>&1 || { echo "FAIL: generate --chat"; cat "$tmp/gen2"; fail=1; }
[ -s "$tmp/model/model.safetensors" ] && [ -s "$tmp/model/tokenizer.json" ] || { echo "FAIL: init-model files"; fail=1; }
# init-model writes every family; inspect reads the folder back (tensors match the config).
for fam in qwen3 mistral phi3 gemma3; do
  "$bin" init-model --config "$src/tests/fixtures/models/$fam/model/config.json" \
      --out "$tmp/init_$fam" >"$tmp/out" 2>&1 || { echo "FAIL: init-model $fam"; cat "$tmp/out"; fail=1; }
  "$bin" inspect "$tmp/init_$fam" >"$tmp/out" 2>&1 || { echo "FAIL: inspect $fam"; cat "$tmp/out"; fail=1; }
  grep -q "config parameter count matches the tensors" "$tmp/out" ||
    { echo "FAIL: inspect $fam counts"; cat "$tmp/out"; fail=1; }
done

# The embedded default with every model-level technique at once: the memory report names each
# saving, and the run writes a PEFT adapter.
"$bin" sft --max_steps 2 --logging_steps 1 --output_dir "$tmp/all" --device cpu --use_peft true \
    --load_in_4bit true --gradient_checkpointing true --activation_offloading true \
    >"$tmp/all.log" 2>&1 || { echo "FAIL: sft with every technique"; cat "$tmp/all.log"; fail=1; }
for line in "estimated peak" "chunked linear cross-entropy:" "activation offloading:" \
    "gradient checkpointing:" "quantized base (nf4): 28 frozen linear weights" "LoRA: 28672 of"; do
  grep -qF "$line" "$tmp/all.log" || { echo "FAIL: memory report lacks '$line'"; cat "$tmp/all.log"; fail=1; }
done
[ -s "$tmp/all/adapter_model.safetensors" ] || { echo "FAIL: no adapter written"; fail=1; }
exit $fail
