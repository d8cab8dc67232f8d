# Setups and checks of cases_signals.tsv: stop signals during training (issue 29).
KTO_LORA=(kto --use_peft --gradient_accumulation_steps 2 --max_steps 30 --logging_steps 1
          --device cpu)
# The run a stopped and resumed one must equal: KTO with LoRA and its default dropout.
kto_lora_straight() {
  "$BIN" "${KTO_LORA[@]}" --output_dir "$W/straight" >"$W/straight.log" 2>&1 ||
    echo "SKIP: the straight run failed: $(tail -1 "$W/straight.log")"
}

# 40 copies of the small dataset: 4800 rows, 2400 micro-batches of 2.
long_epoch() {
  for _ in $(seq 40); do cat "$DATA"; done >"$W/long.jsonl"
}
# The embedded tokenizer's model, widened to hidden 768 and intermediate 2048.
wide_model() {
  sed -e 's/"hidden_size": 128/"hidden_size": 768/' \
      -e 's/"intermediate_size": 384/"intermediate_size": 2048/' \
      "$SRC/data/embedded/config.json" >"$W/wide.json"
  "$BIN" init-model --config "$W/wide.json" --out "$W/wide" --tokenizer "$SRC/data/embedded" \
    >/dev/null 2>&1 || echo "SKIP: init-model failed for the wide model"
}

# The stop was honoured within about a second of the signal (sent $1 s after the start).
stopped_within() {
  [ "$(echo "$secs < $1 + 1.5" | bc)" = 1 ] ||
    { echo "took ${secs}s after a SIGTERM at ${1}s"; return 1; }
}
check_sigterm_mid_accumulation() { stopped_within 1.5; }
check_sigterm_during_generation() { stopped_within 2; }
# The second SIGTERM did not tear the save the first one started.
check_sigterm_twice() {
  local ck
  ck=$(ls -d "$W"/out/checkpoint-* 2>/dev/null | tail -1)
  [ -f "$ck/checkpoint_complete" ] || { echo "no complete checkpoint"; return 1; }
  grep -q "were deferred until it was done" "$W/err" ||
    { echo "the second signal was not noted"; return 1; }
}
# Resumed to the end, the adapter is the straight run's, bit for bit.
check_kto_lora_sigterm_resume() {
  [ -n "$(ls -d "$W"/out/checkpoint-* 2>/dev/null)" ] ||
    { echo "the stop saved no checkpoint"; return 1; }
  "$BIN" "${KTO_LORA[@]}" --output_dir "$W/out" --resume_from_checkpoint latest \
    >"$W/resume.log" 2>&1 ||
    { echo "the resume failed: $(tail -1 "$W/resume.log")"; return 1; }
  cmp -s "$W/straight/adapter_model.safetensors" "$W/out/adapter_model.safetensors" ||
    { echo "the resumed adapter differs from the straight run's"; return 1; }
}
