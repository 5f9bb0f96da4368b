#!/bin/bash
# Heads for the embedded default trained on its own answers (issue 54; measured in benchmarks/heads: no better than the
# shipped heads on HumanEval and worse on MMLU-CoT, so not shipped):
#   1. `zoo regenerate`: its greedy answers to HumanEval's held-in documents and the standard library's functions,
#      taken in turn (never the evaluations' documents), in 26-minute background jobs; rerun to go on (each run
#      continues where the last ended; the chunks are committed under leaderboard/drafts/data as they come);
#   2. `zoo train-head --data`: an EAGLE-1 head and an EAGLE-3 head (its output layer the target's, frozen) on
#      what step 1 has collected.
#   bash scripts/train_heads.sh regenerate | eagle OUT_DIR | eagle3 OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=leaderboard/drafts/data/smollm2-answers
case ${1:?regenerate, eagle or eagle3} in
  regenerate) exec .venv/bin/zoo regenerate smollm2-135m-instruct --out $DATA --prompts specdec_humaneval,python \
                --max-prompts 4000 --minutes 26 --json ;;
  eagle) exec .venv/bin/zoo train-head smollm2-135m-instruct --data $DATA --steps "${STEPS:-1200}" \
           --out "${2:?give the head directory}" --json ;;
  eagle3) exec .venv/bin/zoo train-head smollm2-135m-instruct --kind eagle3 --unroll 4 --output-layer target \
            --data $DATA --steps "${STEPS:-600}" --out "${2:?give the head directory}" --json ;;
  *) echo "usage: scripts/train_heads.sh regenerate | eagle OUT_DIR | eagle3 OUT_DIR" >&2; exit 2 ;;
esac
