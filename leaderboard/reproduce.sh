#!/usr/bin/env bash
# Rebuild the published leaderboard for smollm2-135m-instruct on this machine's CPU: build the two pruned
# drafts, run lm_eval --model specdec for each draft on both offline tasks (baseline timing on), regenerate.
# Takes about 30 minutes on 2 cores. Results land in leaderboard/results/, drafts in leaderboard/drafts/.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
drafts=leaderboard/drafts
[ -d $drafts/smollm2-5l ] || $bin/zoo prune smollm2-135m-instruct --layers 5 --out $drafts/smollm2-5l
[ -d $drafts/smollm2-5l-distilled ] || $bin/zoo prune smollm2-135m-instruct --layers 5 --distill-tokens 65536 --out $drafts/smollm2-5l-distilled
for draft in prompt-lookup layers:0-4 layers:0-3+29 $drafts/smollm2-5l $drafts/smollm2-5l-distilled; do
  $bin/lm_eval --model specdec --model_args "pretrained=smollm2-135m-instruct,draft=$draft,num_draft_tokens=3,baseline=true" \
    --include_path tasks --tasks specdec_humaneval specdec_mmlu_cot --limit 10 --gen_kwargs max_gen_toks=64 \
    --confirm_run_unsafe_code --output_path leaderboard/results/"${draft//[:\/+]/_}"
done
# the drafts' own accuracy, for the TAR-against-accuracy plot
for model in $drafts/smollm2-5l $drafts/smollm2-5l-distilled; do
  $bin/lm_eval --model specdec --model_args "pretrained=$model,draft=prompt-lookup" --include_path tasks \
    --tasks specdec_humaneval specdec_mmlu_cot --limit 10 --gen_kwargs max_gen_toks=64 --confirm_run_unsafe_code \
    --output_path leaderboard/results/as-target_"${model//[:\/+]/_}"
done
$bin/zoo leaderboard leaderboard/results --out leaderboard
