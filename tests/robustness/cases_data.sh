# Setups of cases_data.tsv (sourced by run_cases.sh): training data that must never be silently
# changed (a file has one schema; chat template kwargs cannot replace a conversation), clear
# messages for bad template files and checkpoint positions.

pairs() { printf '%s\n' "$@" >"$W/p.jsonl"; }
# Preference rows: a margin, or an explicit prompt, only from row 2 on.
margin_from_row_2() {
  pairs '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog."}' \
    '{"prompt": "Once,", "chosen": " a cat.", "rejected": " a dog.", "margin": 5}'
}
prompt_from_row_2() {
  pairs '{"chosen": "One day, a cat.", "rejected": "One day, a dog."}' \
    '{"prompt": "Hi there,", "chosen": " a cat.", "rejected": " a dog."}'
}
# Row 2's chosen and rejected share no prefix: only its explicit prompt makes it valid.
prompt_only_in_row_2() {
  pairs '{"chosen": "One day, a cat.", "rejected": "One day, a dog."}' \
    '{"prompt": "Hi there,", "chosen": "A cat.", "rejected": "The dog."}'
}
chosen_from_row_2() {
  printf '%s\n' '{"prompt": "One day,", "completion": " a cat.", "label": true}' \
    '{"prompt": "One day,", "completion": " a dog.", "label": false, "chosen": " a cat.", "rejected": " a dog."}' \
    >"$W/u.jsonl"
}
label_from_row_2() {
  printf '%s\n' '{"prompt": "One day,", "completion": " a cat."}' \
    '{"prompt": "Once,", "completion": " a dog.", "label": false}' \
    '{"prompt": "Then,", "completion": " a bird."}' >"$W/s.jsonl"
}
mask_from_row_2() {
  printf '%s\n' '{"input_ids": [1, 2, 3, 4]}' \
    '{"input_ids": [1, 2, 3, 4], "completion_mask": [0, 0, 1, 1]}' >"$W/t.jsonl"
}
completion_from_row_2() {
  printf '%s\n' '{"prompt": "Add 1 and 2.", "answer": "3"}' \
    '{"prompt": "Add 2 and 2.", "answer": "4", "completion": "4"}' >"$W/q.jsonl"
}
completion_only_in_row_1() {
  printf '%s\n' '{"prompt": "Add 1 and 2.", "completion": "3"}' '{"prompt": "Add 2 and 2."}' >"$W/q.jsonl"
}
chat_pairs() {
  pairs '{"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello"}], "rejected": [{"role": "assistant", "content": "Go"}]}' \
    '{"prompt": [{"role": "user", "content": "Yo"}], "chosen": [{"role": "assistant", "content": "Hey"}], "rejected": [{"role": "assistant", "content": "No"}]}'
}
template_not_utf8() { chat_pairs; printf '\xff{{ messages }}' >"$W/t.jinja"; }
# A dpo or reward checkpoint-1 (two pairs, one per micro-batch) whose data position is edited.
pref_ckpt() {
  pairs '{"prompt": "One day,", "chosen": " a cat.", "rejected": " a dog."}' \
    '{"prompt": "Once,", "chosen": " a cat.", "rejected": " a dog."}'
  "$BIN" "$1" --model_name_or_path "$MODEL" --dataset "$W/p.jsonl" --max_steps 2 --save_steps 1 \
    --per_device_train_batch_size 1 --device cpu --output_dir "$W/out" >/dev/null 2>&1 ||
    echo "SKIP: could not train the $1 checkpoint"
  sed -i "s/\"step_in_epoch\": *[0-9]*/\"step_in_epoch\": $2/" "$W/out/checkpoint-1/leantune_state.json"
}
dpo_step_999() { pref_ckpt dpo 999; }
dpo_step_text() { pref_ckpt dpo '"one"'; }
reward_step_999() { pref_ckpt reward 999; }
sft_step_999() {
  copy_ckpt
  sed -i 's/"step": *[0-9]*,/"step": 999,/' "$W/out/checkpoint-2/leantune_state.json"
}
