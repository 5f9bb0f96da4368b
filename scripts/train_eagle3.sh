#!/bin/bash
# An EAGLE-3 head for the embedded default (issue 40): `zoo train-head --kind eagle3` with the training-time test
# unrolled 4 steps, on the target's continuations of 120 held-in prompts and 200k tokens of Python's standard library
# read teacher-forced, 1000 steps; then its acceptance as a chain and as an EAGLE-2 tree beside the EAGLE-1 head's
# (scripts/tree_acceptance.py, HumanEval, 8 prompts).
#   bash scripts/train_eagle3.sh OUT_DIR [JSON_OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?give the directory for the head}
.venv/bin/zoo train-head smollm2-135m-instruct --kind eagle3 --unroll 4 --max-prompts 120 \
  --text python --text-tokens 200000 --steps 1000 --out "$OUT" --json
.venv/bin/python scripts/tree_acceptance.py --task specdec_humaneval --prompts 8 \
  --config "eagle:$OUT@4" --config "eagle:$OUT@2x4@12" --config "eagle:$OUT@4x6@32" \
  --config "eagle:leaderboard/drafts/smollm2-eagle@4" --config "eagle:leaderboard/drafts/smollm2-eagle@2x4@12" \
  ${2:+--out "$2"}
