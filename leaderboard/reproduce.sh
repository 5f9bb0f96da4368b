#!/usr/bin/env bash
# Rebuild the published leaderboard for smollm2-135m-instruct on this machine's CPU: build the drafts, run
# lm_eval --model specdec for each on both offline tasks (greedy, baseline timing on, the tasks' own 256-token
# budgets, the first LIMIT documents: held out from every draft's build data), then the drafts' own accuracy,
# then regenerate the pages. About 40 minutes on 2 cores with LIMIT=8.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
drafts=leaderboard/drafts
LIMIT=${LIMIT:-8}
[ -d $drafts/smollm2-5l-distilled ] || $bin/zoo prune smollm2-135m-instruct --layers 5 --distill-tokens 65536 --out $drafts/smollm2-5l-distilled
[ -d $drafts/smollm2-ngram ] || $bin/zoo ngram smollm2-135m-instruct --out $drafts/smollm2-ngram
run() {  # OUT_NAME MODEL_ARGS
  $bin/lm_eval --model specdec --model_args "$2" --include_path tasks --tasks specdec_humaneval specdec_mmlu_cot \
    --limit "$LIMIT" --confirm_run_unsafe_code --output_path "leaderboard/results/$1"
}
target=pretrained=smollm2-135m-instruct,baseline=true
run auto "$target,draft=auto"
run prompt-lookup "$target,draft=prompt-lookup,num_draft_tokens=4"
run ngram "$target,draft=ngram:$drafts/smollm2-ngram,dynamic_gamma=true"
run layers_0-4 "$target,draft=layers:0-4,dynamic_gamma=true"
run smollm2-5l-distilled "$target,draft=$drafts/smollm2-5l-distilled,dynamic_gamma=true"
run as-target_smollm2-5l-distilled "pretrained=$drafts/smollm2-5l-distilled,draft=prompt-lookup"  # its accuracy
$bin/zoo leaderboard leaderboard/results --out leaderboard
