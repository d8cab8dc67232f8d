#!/usr/bin/env bash
# A Hub ID as --model_name_or_path / --model, found offline in a cache folder laid out as
# huggingface_hub lays it out (models--Org--Name/refs/<branch> -> snapshots/<commit>/): sft,
# generate and estimate run from it under HF_HUB_CACHE and under HF_HOME; --model_revision picks
# a branch or a commit; an ID that is not cached, a revision that is not, and a path that does
# not exist are each one line, exit 2, naming the option (and the download command); a YAML
# config (TRL's CLI style) with the ID on the command line trains offline; distill's
# --teacher_model_revision picks the teacher's branch.
# usage: hub_cache.sh TRAINER_BIN SOURCE_DIR
set -u
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
data=$src/tests/fixtures/trainer/stories_small.jsonl

# The cache: one model at commit 1111aaaa (main), another (other weights) at 2222bbbb (branch v2).
repo=$tmp/cache/models--Org--Tiny-Model
mkdir -p "$repo/refs" "$repo/snapshots"
for c in 1111aaaa:3 2222bbbb:4; do
  "$bin" init-model --config "$src/data/embedded/config.json" --out "$repo/snapshots/${c%%:*}" \
      --seed "${c##*:}" --tokenizer "$src/data/embedded" >/dev/null 2>&1 ||
    { echo "FAIL: init-model"; exit 1; }
done
echo -n 1111aaaa >"$repo/refs/main"
echo -n 2222bbbb >"$repo/refs/v2"

run() {  # what, expected exit, fragment, args...
  local what=$1 want=$2 frag=$3
  shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -qF -- "$frag" "$tmp/out" "$tmp/err"; then
    echo "FAIL ($what): exit $rc (want $want), no '$frag' in:"
    cat "$tmp/out" "$tmp/err" | tail -5
    fail=1
  elif [ "$want" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
    echo "FAIL ($what): more than one line on stderr:"
    cat "$tmp/err"
    fail=1
  else
    echo "ok ($what)"
  fi
}

export HF_HUB_CACHE=$tmp/cache
run "sft from the cache" 0 "model written to" "$bin" sft --model_name_or_path Org/Tiny-Model \
    --dataset "$data" --max_steps 1 --max_length 64 --device cpu --output_dir "$tmp/out1"
run "sft on a branch" 0 "model written to" "$bin" sft --model_name_or_path Org/Tiny-Model \
    --model_revision v2 --dataset "$data" --max_steps 1 --max_length 64 --device cpu \
    --output_dir "$tmp/out2"
run "sft at a commit" 0 "model written to" "$bin" sft --model_name_or_path Org/Tiny-Model \
    --model_revision 2222bbbb --dataset "$data" --max_steps 1 --max_length 64 --device cpu \
    --output_dir "$tmp/out3"
# The branch and its commit are the same weights; main's are others.
loss() { grep -o '"loss":[-0-9.e]*' "$1/metrics.jsonl" | head -1; }
[ "$(loss "$tmp/out2")" = "$(loss "$tmp/out3")" ] && [ "$(loss "$tmp/out1")" != "$(loss "$tmp/out2")" ] &&
  [ -n "$(loss "$tmp/out1")" ] || { echo "FAIL: revisions: $(loss "$tmp/out1") $(loss "$tmp/out2") $(loss "$tmp/out3")"; fail=1; }
# A TRL-style YAML config with the ID on the command line (issue: --config x.yaml + Org/Name).
cat >"$tmp/sft.yaml" <<YAML
# leantune sft, TRL names
dataset_name: $data
max_steps: 1
max_length: 64
learning_rate: 2.0e-5
lr_scheduler_type: cosine
warmup_steps: 0.1
device: cpu
output_dir: $tmp/out9
YAML
run "YAML config and a Hub ID" 0 "model written to $tmp/out9" "$bin" sft --config "$tmp/sft.yaml" \
    --model_name_or_path Org/Tiny-Model
run "generate from the cache" 0 "" "$bin" generate --model Org/Tiny-Model --prompt "Once" \
    --max_new_tokens 4 --device cpu
[ -s "$tmp/out" ] || { echo "FAIL (generate from the cache): no completion printed"; fail=1; }
run "estimate from the cache" 0 "parameters" "$bin" estimate --model_name_or_path Org/Tiny-Model \
    --max_length 64
run "LoRA adapter names its base by ID" 0 '"base_model_name_or_path": "Org/Tiny-Model"' \
    bash -c "'$bin' sft --model_name_or_path Org/Tiny-Model --dataset '$data' --max_steps 1 \
    --max_length 64 --device cpu --use_peft --output_dir '$tmp/out4' >/dev/null && \
    cat '$tmp/out4/adapter_config.json'"
run "the adapter's model card links the base" 0 \
    "fine-tuned version of [Org/Tiny-Model](https://huggingface.co/Org/Tiny-Model)" \
    cat "$tmp/out4/README.md"
run "not cached" 2 "huggingface-cli download Org/Other" "$bin" sft \
    --model_name_or_path Org/Other --dataset "$data" --max_steps 1 --output_dir "$tmp/out5"
run "revision not cached" 2 "revision 'v3' is not in the Hugging Face cache" "$bin" sft \
    --model_name_or_path Org/Tiny-Model --model_revision v3 --dataset "$data" --max_steps 1 \
    --output_dir "$tmp/out6"
run "not a path nor an ID" 2 "option --model_name_or_path: '$tmp/none/x' does not exist" "$bin" \
    sft --model_name_or_path "$tmp/none/x" --dataset "$data" --max_steps 1 \
    --output_dir "$tmp/out7"
# distill's teacher from the cache: --teacher_model_revision picks its branch (main's weights are
# the student's own: a divergence of 0 at the first step; v2's are others).
prompts=$src/tests/fixtures/datasets/prompt_only.jsonl
for rev in main v2; do
  run "distill teacher at $rev" 0 "model written to" "$bin" distill --model_name_or_path \
      Org/Tiny-Model --teacher_model_name_or_path Org/Tiny-Model --teacher_model_revision "$rev" \
      --dataset "$prompts" --max_steps 1 --max_completion_length 4 --device cpu \
      --per_device_train_batch_size 1 --logging_steps 1 \
      --output_dir "$tmp/teacher_$rev"
done
awk -v a="$(loss "$tmp/teacher_main" | cut -d: -f2)" -v b="$(loss "$tmp/teacher_v2" | cut -d: -f2)" \
  'BEGIN { exit !(a != "" && b != "" && a + 0 < 1e-6 && b + 0 > 1e-4) }' ||
  { echo "FAIL: teacher revisions: $(loss "$tmp/teacher_main") $(loss "$tmp/teacher_v2")"; fail=1; }
run "teacher revision not cached" 2 "revision 'v3' is not in the Hugging Face cache" "$bin" \
    distill --model_name_or_path Org/Tiny-Model --teacher_model_name_or_path Org/Tiny-Model \
    --teacher_model_revision v3 --dataset "$prompts" --max_steps 1 --output_dir "$tmp/out9"
unset HF_HUB_CACHE
mkdir -p "$tmp/home" && mv "$tmp/cache" "$tmp/home/hub"
run "HF_HOME's hub folder" 0 "model written to" env HF_HOME="$tmp/home" "$bin" sft \
    --model_name_or_path Org/Tiny-Model --dataset "$data" --max_steps 1 --max_length 64 \
    --device cpu --output_dir "$tmp/out8"
exit $fail
