#!/bin/bash
# Medusa heads for the embedded default (issue 40): `zoo train-head --kind medusa` through the library with a smaller
# batch than the EAGLE default (4 windows of 128 tokens: each step runs four full-vocabulary heads), then their
# acceptance as chains and trees next to the EAGLE head's (scripts/tree_acceptance.py, HumanEval, 8 prompts).
#   bash scripts/train_medusa.sh OUT_DIR [JSON_OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?give the directory for the heads}
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path

from specdraft_eval.models.targets import LoadSettings
from zoo.build.train_head import HeadTraining, train_head

settings = HeadTraining(kind="medusa", medusa_heads=4, steps=600, batch_size=4, window=128, max_prompts=120)
result = train_head("smollm2-135m-instruct", Path(sys.argv[1]), settings, LoadSettings.of("cpu", "float32", "plain"),
                    log=lambda line: print(line, flush=True))
print(json.dumps(result, default=str), flush=True)
PY
.venv/bin/python scripts/tree_acceptance.py --task specdec_humaneval --prompts 8 \
  --config "medusa:$OUT@1@4" --config "medusa:$OUT@2@8" --config "medusa:$OUT@4@16" \
  --config "eagle:leaderboard/drafts/smollm2-eagle@4" --config "eagle:leaderboard/drafts/smollm2-eagle@2x4@12" \
  ${2:+--out "$2"}
