"""Token trees against chains on the embedded default: mean accepted length (tokens per target step) and tokens/s,
greedy, batch 1, every configuration on the same prompts, interleaved per prompt after a warm-up.

    python scripts/tree_acceptance.py [--task specdec_humaneval] [--prompts 8] [--skip 0] [--tokens 128]
        [--config DRAFT@GAMMA ...] [--out FILE]

A configuration is a draft string and its γ (for a tree, its node budget), e.g. ``prompt-lookup:3@4`` or
``eagle:leaderboard/drafts/smollm2-eagle@4x5@12`` (EAGLE-2's dynamic tree: top-4, 5 deep, 12 nodes). Prints a table
(median [min-max] over prompts of tokens/s; TAR and acceptance by depth over all steps) and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from tabulate import tabulate

from specdraft_eval import load_draft, load_target
from specdraft_eval.engine.loop import autoregressive_generate, speculative_generate
from specdraft_eval.integration.offline_data import task_prompts
from specdraft_eval.measure.stats import GenerationStats

DEFAULTS = ["prompt-lookup:3@4", "prompt-lookup:3x3@8", "suffix@8", "eagle:leaderboard/drafts/smollm2-eagle@4",
            "eagle:leaderboard/drafts/smollm2-eagle@2x4@6", "eagle:leaderboard/drafts/smollm2-eagle@4x5@12",
            "eagle:leaderboard/drafts/smollm2-eagle@8x6@24"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="specdec_humaneval")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--skip", type=int, default=0, help="prompts to skip first (held-out documents)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--config", action="append", help="DRAFT@GAMMA (repeatable)")
    parser.add_argument("--out", default="tree_acceptance.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_target(args.target, kernels="onednn")
    configs = []
    for text in args.config or DEFAULTS:
        draft, _, gamma = text.rpartition("@")
        configs.append((text, load_draft(draft, target), int(gamma)))
    prompts = [target.tokenizer(p, return_tensors="pt").input_ids
               for p in task_prompts(args.task)[args.skip: args.skip + args.prompts]]
    with torch.inference_mode():
        for _, drafter, gamma in configs:  # warm-up
            speculative_generate(target.model, drafter, prompts[0], 8, num_draft_tokens=gamma)
        autoregressive_generate(target.model, prompts[0], 8)
        stats = {text: GenerationStats() for text, _, _ in configs}
        rates: dict[str, list[float]] = {text: [] for text, _, _ in configs} | {"plain": []}
        reference = {}
        for i, prompt in enumerate(prompts):
            out, plain = autoregressive_generate(target.model, prompt, args.tokens)
            reference[i] = out
            rates["plain"].append(plain.baseline_tokens_per_second)
            for text, drafter, gamma in configs:
                new, run = speculative_generate(target.model, drafter, prompt, args.tokens, num_draft_tokens=gamma)
                if new != out:
                    raise SystemExit(f"{text} differs from plain greedy decoding on prompt {i}: a bug")
                stats[text] += run
                rates[text].append(run.tokens_per_second)
            print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    base = statistics.median(rates["plain"])
    rows = [{"config": "plain", "tok/s": base, "tok/s min": min(rates["plain"]), "tok/s max": max(rates["plain"])}]
    for text, _, _ in configs:
        s = stats[text]
        rows.append({"config": text, "tok/s": statistics.median(rates[text]), "tok/s min": min(rates[text]),
                     "tok/s max": max(rates[text]), "vs plain": statistics.median(rates[text]) / base, "TAR": s.tar,
                     "nodes/step": s.draft_tokens / s.steps if s.steps else None,
                     "accept by depth": " ".join(f"{r:.2f}" for r in s.acceptance_rate_per_position[:6])})
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".3g"))
    Path(args.out).write_text(json.dumps({"task": args.task, "prompts": args.prompts, "skip": args.skip,
                                          "tokens": args.tokens, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
