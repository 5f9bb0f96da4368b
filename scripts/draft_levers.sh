#!/usr/bin/env bash
# Issue 16's runs: each draft configuration on both offline tasks, greedy, baseline timing on, a token budget
# that lets the chain of thought finish, on held-out documents (the distilled drafts trained on HumanEval[40:]
# and MMLU-CoT[80:]). Usage: scripts/draft_levers.sh OUT_DIR 'DRAFT[,model_args...]' ...
# e.g. scripts/draft_levers.sh leaderboard/results "prompt-lookup,dynamic_gamma=true"
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1; shift
LIMIT=${LIMIT:-8}; TOKENS=${TOKENS:-256}
for config in "$@"; do
  name=${config//[:\/+|=,]/_}
  .venv/bin/lm_eval --model specdec --model_args "pretrained=smollm2-135m-instruct,draft=$config,baseline=true" \
    --include_path tasks --tasks specdec_humaneval specdec_mmlu_cot --limit "$LIMIT" \
    --gen_kwargs "max_gen_toks=$TOKENS" --confirm_run_unsafe_code --output_path "$out/$name"
done
