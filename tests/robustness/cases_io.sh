# Setups and checks of cases_io.tsv (sourced by run_cases.sh): outputs that must never destroy an
# input or be left half-written, on a full disk included.

# A trained model in $W/m.
model_copy() { cp -r "$MODEL" "$W/m"; }
# A dataset copy in $W/d.jsonl, and a symlink to it.
data_copy() { cp "$DATA" "$W/d.jsonl"; ln -s d.jsonl "$W/l.jsonl"; }
# A checkpoint folder reached through a symlink.
ckpt_link() { copy_ckpt; ln -s "$W/out/checkpoint-2" "$W/link"; }
ckpt_truncated() { copy_ckpt; truncate -s -100 "$W/out/checkpoint-2/model.safetensors"; }
# An allocator trace of one update.
trace_file() {
  "$BIN" sft --model_name_or_path "$MODEL" --dataset "$DATA" --max_length 64 --max_steps 1 \
    --device cpu --output_dir "$W/out" --memory_trace "$W/t.json" >/dev/null 2>&1 ||
    echo "SKIP: could not write the trace"
  cp "$W/t.json" "$W/t.orig"
}
# An existing output, and prompts whose second row has no prompt.
output_and_bad_prompts() {
  echo keep >"$W/c.jsonl"
  printf '%s\n' '{"prompt": "One day,"}' '{"text": "no prompt"}' >"$W/bad.jsonl"
}
many_prompts() { for _ in $(seq 200); do echo '{"prompt": "One day, there was a"}'; done >"$W/many.jsonl"; }
# A model whose tokenizer.json (padded with spaces: still the same JSON) is larger than a LoRA
# adapter, so that a file-size limit between the two lands on the tokenizer copy; pairs to train.
big_tokenizer() {
  cp -r "$MODEL" "$W/m"
  head -c 200000 /dev/zero | tr '\0' ' ' >>"$W/m/tokenizer.json"
  printf '%s\n' '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog."}' \
    '{"prompt": "Once,", "chosen": " a cat.", "rejected": " a dog."}' >"$W/p.jsonl"
}
reward_model_pairs() {
  reward_model_prompts
  printf '%s\n' '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog."}' >"$W/p.jsonl"
  cp "$W/p.jsonl" "$W/p.orig"
}

# No temporary file or folder of a write is left in $1.
no_temp_left() {
  local left
  left=$(ls -A "$1" | grep -E '\.tmp[.-]|\.old-' | tr '\n' ' ')
  [ -z "$left" ] || { echo "temporary files left in $1: $left"; return 1; }
}
check_init_model_over_trained() {
  cmp -s "$W/m/model.safetensors" "$MODEL/model.safetensors" || { echo "the model's weights changed"; return 1; }
}
check_init_model_overwrite() {
  ! cmp -s "$W/m/model.safetensors" "$MODEL/model.safetensors" || { echo "weights not replaced"; return 1; }
  [ ! -e "$W/m/tokenizer.json" ] || { echo "the old folder's files survived the replacement"; return 1; }
  no_temp_left "$W"
}
check_init_model_missing_tokenizer() {
  [ ! -e "$W/new" ] || { echo "the model was written before the tokenizer was checked"; return 1; }
  no_temp_left "$W"
}
check_consolidate_into_itself() {
  [ ! -e "$W/out/checkpoint-2/exp" ] || { echo "the checkpoint was copied into itself"; return 1; }
}
check_consolidate_into_itself_symlink() { check_consolidate_into_itself; }
check_consolidate_truncated_model() {
  [ ! -e "$W/exp" ] || { echo "a copy of the truncated checkpoint was written"; return 1; }
  no_temp_left "$W"
}
check_pack_out_is_dataset() {
  cmp -s "$W/d.jsonl" "$DATA" || { echo "the dataset was overwritten"; return 1; }
}
check_pack_out_links_to_dataset() {
  cmp -s "$W/d.jsonl" "$DATA" && [ -L "$W/l.jsonl" ] || { echo "the dataset or its link changed"; return 1; }
}
check_lengths_plot_is_dataset() { check_pack_out_is_dataset; }
check_sft_memory_trace_is_dataset() { check_pack_out_is_dataset; }
check_memviz_out_is_trace() {
  cmp -s "$W/t.json" "$W/t.orig" || { echo "the trace was overwritten"; return 1; }
}
check_generate_bad_row_keeps_output() {
  [ "$(cat "$W/c.jsonl")" = keep ] || { echo "the existing output was emptied"; return 1; }
  no_temp_left "$W"
}
check_generate_output_disk_full() {
  [ ! -e "$W/c.jsonl" ] || { echo "a torn c.jsonl was left"; return 1; }
  no_temp_left "$W"
}
# A LoRA run stopped by a full disk leaves no torn tokenizer.json.
check_lora_disk_full() {
  if [ -e "$W/out/tokenizer.json" ] && ! cmp -s "$W/out/tokenizer.json" "$W/m/tokenizer.json"; then
    echo "torn tokenizer.json"; return 1
  fi
  no_temp_left "$W/out"
}
check_dpo_lora_disk_full() { check_lora_disk_full; }
check_reward_lora_disk_full() { check_lora_disk_full; }
check_memory_trace_disk_full() {
  [ -f "$W/out/adapter_model.safetensors" ] || { echo "the adapter was not saved"; return 1; }
  [ ! -e "$W/t.json" ] || { echo "a torn trace was left"; return 1; }
  no_temp_left "$W"
}
check_score_out_is_dataset() {
  cmp -s "$W/p.jsonl" "$W/p.orig" || { echo "the dataset was overwritten"; return 1; }
}
