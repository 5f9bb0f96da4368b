#!/usr/bin/env bash
# The bench behind docs/performance.md: zoo bench on both bundled tasks with every built-in draft kind
# (prompt lookup, a layer view, a pruned and distilled model draft; build it with leaderboard/reproduce.sh).
# Writes docs/bench_<task>.json. About 20 minutes on the project's 2-core CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
DISTILLED=${DISTILLED:-leaderboard/drafts/smollm2-5l-distilled}
for task in specdec_humaneval specdec_mmlu_cot; do
  .venv/bin/zoo bench --target smollm2-135m-instruct --drafts prompt-lookup --drafts layers:0-4 --drafts "$DISTILLED" \
    --task "$task" --limit 2 --max-new-tokens 64 --gamma 4 --repeats 3 --json > "benchmarks/bench/bench_$task.json.tmp"
  mv "benchmarks/bench/bench_$task.json.tmp" "benchmarks/bench/bench_$task.json"
done
