#!/bin/bash
# An EAGLE-3 head for the embedded default (issue 40): `zoo train-head --kind eagle3` (120 held-in prompts, the
# default 700 steps), then its acceptance as a chain and as an EAGLE-2 tree beside the EAGLE-1 head's
# (scripts/tree_acceptance.py, HumanEval, 8 prompts).
#   bash scripts/train_eagle3.sh OUT_DIR [JSON_OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?give the directory for the head}
.venv/bin/zoo train-head smollm2-135m-instruct --kind eagle3 --max-prompts 120 --out "$OUT" --json
.venv/bin/python scripts/tree_acceptance.py --task specdec_humaneval --prompts 8 \
  --config "eagle:$OUT@4" --config "eagle:$OUT@2x4@12" \
  --config "eagle:leaderboard/drafts/smollm2-eagle@4" --config "eagle:leaderboard/drafts/smollm2-eagle@2x4@12" \
  ${2:+--out "$2"}
