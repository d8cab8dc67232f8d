# Setups and checks of cases_children.tsv: the processes trainer_bin starts (reward commands).
# Each setup writes the reward command's script to $W/r.sh; rows run it with
# --reward_command "bash $W/r.sh". The suite fails a row when any process of the command (its
# own children included) outlives trainer_bin.
reward_script() { printf '%s\n' "$@" >"$W/r.sh"; }
# Valid answers that say "no reward" for every completion.
reward_all_null() { reward_script 'while IFS= read -r line; do echo null; done'; }
# Two answers per input line: the second would be taken for the next completion's.
reward_two_answers() { reward_script 'while IFS= read -r line; do echo 1; echo 0; done'; }
# Finite answers whose group statistics overflow a double.
reward_overflow() {
  reward_script 'i=0' 'while IFS= read -r line; do' '  i=$((i + 1))' \
    '  if [ $((i % 2)) = 0 ]; then echo 1.7e308; else echo -1.7e308; fi' 'done'
}
# Never answers; a child of its own (a pipeline) holds the socket too.
reward_stuck() { reward_script 'sleep 300 | cat'; }
# Exits at once with code 3, leaving a helper process behind it.
reward_exits_early() { reward_script 'sleep 300 </dev/null >/dev/null &' 'exit 3'; }
# A helper process for the whole session (as a Python server would be), and slow answers.
reward_slow() {
  reward_script 'sleep 300 </dev/null >/dev/null &' \
    'while IFS= read -r line; do sleep 0.2; echo 0; done'
}

# metrics.jsonl has no null (a NaN or infinite metric) and at least one record.
metrics_numbers_only() {
  local f=$W/out/metrics.jsonl
  [ -s "$f" ] || { echo "no records in $f"; return 1; }
  if grep -q 'null' "$f"; then
    echo "metrics.jsonl holds null: $(grep -o '"[^"]*":null' "$f" | sort -u | head -3 | tr '\n' ' ')"
    return 1
  fi
}
check_reward_all_null() { metrics_numbers_only; }
check_reward_overflow() {
  grep -q "the rewards are not finite (group 1's reward standard deviation overflows)" "$W/err" ||
    { echo "no warning naming the overflow"; return 1; }
  metrics_numbers_only
}
# The stop came within about a second of the signal (sent 1.5 s after the start).
check_reward_sigterm_while_waiting() {
  [ "$(echo "$secs < 3.5" | bc)" = 1 ] ||
    { echo "took ${secs}s after a SIGTERM at 1.5s"; return 1; }
}
check_nonfinite_loss_metrics() {
  grep -q '"nonfinite_steps":1' "$W/out/metrics.jsonl" || { echo "no nonfinite_steps count"; return 1; }
  metrics_numbers_only
}
