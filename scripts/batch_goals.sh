#!/usr/bin/env bash
# Issue 51's batch study: each draft at batch 1, 2, 4, 8, 16 on the first 16 HumanEval prompts (last 512 tokens
# each), 32 new tokens, greedy, γ 2, γ 4 and dynamic γ, speculative and plain interleaved per repeat; one JSON per
# draft under OUT_DIR (default benchmarks/batch). Usage: scripts/batch_goals.sh [OUT_DIR] 'DRAFT' ...
# e.g. scripts/batch_goals.sh benchmarks/batch "eagle:leaderboard/drafts/smollm2-eagle" "prompt-lookup"
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/batch}; shift
SIZES=${SIZES:-1,2,4,8,16}; GAMMAS=${GAMMAS:-2,4,dynamic}; REPEATS=${REPEATS:-2}; TOKENS=${TOKENS:-32}
mkdir -p "$out"
for draft in "$@"; do
  name=${draft//[:\/+|=,@]/_}
  .venv/bin/zoo bench --target smollm2-135m-instruct --drafts "$draft" --batch-size "$SIZES" --gamma "$GAMMAS" \
    --limit 16 --max-new-tokens "$TOKENS" --repeats "$REPEATS" --json > "$out/$name.json.tmp"
  mv "$out/$name.json.tmp" "$out/$name.json"
done
