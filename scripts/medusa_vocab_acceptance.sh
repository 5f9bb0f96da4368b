#!/bin/bash
# Medusa heads cut to a reduced vocabulary (vLLM's token_map, what `zoo train-head --kind medusa --vocab-top K`
# writes) against the same heads over the whole vocabulary: acceptance and tokens/s side by side
# (scripts/tree_acceptance.py, HumanEval, 8 prompts). The vocabulary is the shipped EAGLE head's (the target's
# commonest tokens in its own continuations of the held-in prompts, the recipe --vocab-top follows).
#   bash scripts/medusa_vocab_acceptance.sh HEADS_DIR [JSON_OUT]     (HEADS_DIR: from scripts/train_medusa.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
HEADS=${1:?give a Medusa head directory over the whole vocabulary}
CUT=$(mktemp -d)/cut
.venv/bin/python - "$HEADS" "$CUT" <<'PY'
import json, sys
from pathlib import Path

from specdraft_eval.drafts.medusa import read_heads
from zoo.build.train_head import save_medusa

heads, config = read_heads(Path(sys.argv[1]))
ids = json.loads(Path("leaderboard/drafts/smollm2-eagle/eagle.json").read_text())["token_ids"]
Path(sys.argv[2]).mkdir(parents=True)
save_medusa(Path(sys.argv[2]), heads, config.get("base_model_name_or_path", "?"), config.get("specdraft_eval", {}), ids)
print(f"cut to {len(ids)} tokens: {sys.argv[2]}", flush=True)
PY
.venv/bin/python scripts/tree_acceptance.py --task specdec_humaneval --prompts 8 \
  --config "medusa:$HEADS@1@4" --config "medusa:$CUT@1@4" --config "medusa:$HEADS@4@16" --config "medusa:$CUT@4@16" \
  ${2:+--out "$2"}
