"""How good is TAR at a smaller γ estimated from one run at γ (``GenerationStats.tar_at``)?

Runs each draft on the embedded default at γ = 4 and at every smaller γ' for real (greedy, the bundled
tasks' first prompts), and prints the estimate from the γ = 4 run next to the real TAR at γ'. Writes the
figures as JSON. TAR does not depend on timing, so this can run beside other work.

    .venv/bin/python scripts/tar_estimate.py --drafts prompt-lookup layers:0-4 --prompts 10 \
        --out benchmarks/acceptance/tar_estimate.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tabulate import tabulate

from specdraft_eval import load_draft, load_target, speculative_generate
from specdraft_eval.files import atomic_write
from specdraft_eval.integration.offline_data import task_prompts
from specdraft_eval.measure.stats import GenerationStats

TASKS = ("specdec_humaneval", "specdec_mmlu_cot")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafts", nargs="+", default=["prompt-lookup", "layers:0-4"])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=10, help="prompts per task")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/acceptance/tar_estimate.json"))
    args = parser.parse_args()
    loaded = load_target(args.target)
    target, tokenizer = loaded.model, loaded.tokenizer
    prompts = {task: [tokenizer(t, return_tensors="pt").input_ids[:, -512:] for t in task_prompts(task)[: args.prompts]]
               for task in TASKS}
    rows = []
    for name in args.drafts:
        draft = load_draft(name, loaded)
        for task, ids in prompts.items():
            runs = {}
            for gamma in range(args.gamma, 0, -1):
                total = GenerationStats()
                for prompt in ids:
                    total = total + speculative_generate(target, draft, prompt, args.max_new_tokens,
                                                         num_draft_tokens=gamma)[1]
                runs[gamma] = total
                print(f"{draft.name} {task} γ={gamma}: TAR {total.summary()['tar']:.3f}", flush=True)
            for gamma in range(1, args.gamma):
                estimate, real = runs[args.gamma].tar_at(gamma), runs[gamma].summary()["tar"]
                rows.append({"draft": draft.name, "task": task, "from_gamma": args.gamma, "gamma": gamma,
                             "estimated_tar": estimate, "real_tar": real, "deviation": estimate / real - 1})
                print(rows[-1], flush=True)
    atomic_write(args.out, json.dumps({"target": args.target, "prompts_per_task": args.prompts,
                                       "max_new_tokens": args.max_new_tokens, "rows": rows}, indent=2) + "\n")
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".3f"))
    worst = max(abs(r["deviation"]) for r in rows)
    print(f"max |deviation| {worst:.1%}, median {sorted(abs(r['deviation']) for r in rows)[len(rows) // 2]:.1%}")


if __name__ == "__main__":
    main()
