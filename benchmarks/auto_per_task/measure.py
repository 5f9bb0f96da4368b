"""``draft=auto`` per task (issue 62's goals), on this machine with the embedded default target and the published
results (an empty results store, so nothing measured here earlier decides):

1. one ``lm_eval`` command with both bundled tasks: the configuration each task decodes with, and why
   (``both_tasks.json``: the record's ``auto`` block);
2. HumanEval's held-out documents 20-39 (past the leaderboard's 0-19, never in any draft's build data): TAR and
   speedup of what ``draft=auto`` picks for HumanEval now, against the configuration it picked for every task
   before (the best geometric mean over the tasks measured) on the same documents (``held_out_humaneval.json``).

Run from the repository root: ``.venv/bin/python benchmarks/auto_per_task/measure.py`` (about 20 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
HELD_OUT = list(range(20, 40))
BEFORE = "suffix:leaderboard/drafts/smollm2-ngram?max_spec_factor=2.0,num_draft_tokens=16"  # the geometric-mean pick


def lm_eval(model_args: str, tasks: str, env: dict, out: Path, *selection: str) -> dict:
    """The run's specdec block."""
    done = subprocess.run([str(BIN / "lm_eval"), "--model", "specdec", "--model_args",
                           f"pretrained=smollm2-135m-instruct,{model_args}", "--include_path", "tasks",
                           "--tasks", tasks, *selection, "--confirm_run_unsafe_code", "--output_path", str(out)],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"lm_eval {model_args} failed:\n{done.stderr[-3000:]}")
    [file] = out.rglob("results_*.json")
    return json.loads(file.read_text())["config"]["specdec"]


def figures(block: dict) -> dict:
    return {"draft": block["draft"], "num_draft_tokens": block["num_draft_tokens"],
            "dynamic_gamma": block["dynamic_gamma"], "tar": block["tar"], "speedup": block["speedup"],
            "end_to_end_speedup": block.get("end_to_end_speedup"), "tokens_per_second": block["tokens_per_second"],
            "baseline_tokens_per_second": block["baseline_tokens_per_second"], "generations": block["generations"]}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPECDRAFT_EVAL_STORE": str(Path(tmp) / "store"), "TOKENIZERS_PARALLELISM": "false"}
        both = lm_eval("draft=auto", "specdec_humaneval,specdec_mmlu_cot", env, Path(tmp) / "both", "--limit", "2",
                       "--gen_kwargs", "max_gen_toks=64")
        (HERE / "both_tasks.json").write_text(json.dumps({
            "command": "lm_eval --model specdec --model_args pretrained=smollm2-135m-instruct,draft=auto "
                       "--include_path tasks --tasks specdec_humaneval,specdec_mmlu_cot --limit 2 "
                       "--gen_kwargs max_gen_toks=64 --confirm_run_unsafe_code",
            "auto": both["auto"]["tasks"], "configurations": [both["draft"]] + [
                c["draft"] for c in both["auto"]["configurations"]]}, indent=1, ensure_ascii=False) + "\n")
        selection = ("--samples", json.dumps({"specdec_humaneval": HELD_OUT}), "--gen_kwargs", "max_gen_toks=128")
        now = lm_eval("draft=auto,baseline=true", "specdec_humaneval", env, Path(tmp) / "now", *selection)
        env["SPECDRAFT_EVAL_STORE"] = str(Path(tmp) / "store2")  # the first run's result must not decide the second
        before = lm_eval(f"draft={BEFORE},baseline=true", "specdec_humaneval", env, Path(tmp) / "before", *selection)
        (HERE / "held_out_humaneval.json").write_text(json.dumps({
            "command": "lm_eval --model specdec --model_args pretrained=smollm2-135m-instruct,draft=DRAFT,"
                       "baseline=true --include_path tasks --tasks specdec_humaneval "
                       "--samples '{\"specdec_humaneval\": [20..39]}' --gen_kwargs max_gen_toks=128 "
                       "--confirm_run_unsafe_code",
            "auto_now": {**figures(now), "reason": now["auto"]["tasks"]["specdec_humaneval"]["reason"]},
            "auto_before": figures(before)}, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(json.loads((HERE / "both_tasks.json").read_text())["auto"], indent=1))
    print(json.dumps(json.loads((HERE / "held_out_humaneval.json").read_text()), indent=1))


if __name__ == "__main__":
    main()
