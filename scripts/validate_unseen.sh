#!/bin/bash
# Issue 39's goal: `zoo validate` on a configuration outside benchmarks/validation/validation_grid.json (prompt lookup with 2-grams,
# a 3-layer view, γ 3 and 6, 5 MMLU-CoT prompts), three separate runs of the same command; each run's figures in
# benchmarks/validation/unseen/runN.json (and .png), a summary line per run at the end. About 8 minutes a run on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ZOO=${ZOO:-.venv/bin/zoo}
for run in ${RUNS:-1 2 3}; do
  $ZOO validate --target smollm2-135m-instruct --drafts prompt-lookup:2 --drafts layers:0-2 \
    --task specdec_mmlu_cot --prompts 5 --gamma 3,6 --repeats 3 \
    --plot "benchmarks/validation/unseen/run$run.png" | tail -n 12
done
.venv/bin/python - <<'PY'
import json, pathlib
for path in sorted(pathlib.Path("benchmarks/validation/unseen").glob("run*.json")):
    d = json.loads(path.read_text())
    print(f"{path.name}: |speedup dev| median {d['median_abs_deviation']:.1%} max {d['max_abs_deviation']:.1%}; "
          f"tokens/s median {d['tokens_per_second_median_abs_deviation']:.1%} max {d['tokens_per_second_max_abs_deviation']:.1%}")
PY
