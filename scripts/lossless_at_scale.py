"""Greedy losslessness at scale: speculative output equals the target's own greedy decoding, token for token.

For PROMPTS prompts taken in turn from the bundled tasks (HumanEval, MMLU-CoT), the target decodes greedily with
transformers' ``generate`` (its own decoding, plain kernels), then our engine decodes the same prompt with each
draft kind (oneDNN kernels, the default, so the comparison also covers the kernel path); any difference is
reported with the first differing index and the target's logit margin there (``engine.divergence``).

  .venv/bin/python scripts/lossless_at_scale.py --prompts 200 \
      --out benchmarks/lossless/lossless_at_scale.json   (~20 min)

``--resume`` continues from the figures already in ``--out`` (it is rewritten every 10 prompts), so a run stopped
part way need not start over.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import replace
from itertools import zip_longest
from pathlib import Path

import torch
from tqdm import tqdm

from specdraft_eval.drafts import load_draft
from specdraft_eval.engine.loop import divergence, speculative_generate
from specdraft_eval.files import write_json
from specdraft_eval.integration.offline_data import task_prompts
from specdraft_eval.measure.stats import Divergence
from specdraft_eval.models import kernels
from specdraft_eval.models.targets import Target, load_target

REPO = Path(__file__).resolve().parents[1]
DRAFTS = ["prompt-lookup", "layers:0-4", "prompt-lookup:2-3|leaderboard/drafts/smollm2-ngram"]


def _in_repo(spec: str) -> str:
    """``spec`` with repo-relative draft directories made absolute, so the script runs from any folder."""
    return "|".join(str(REPO / part) if (REPO / part).is_dir() else part for part in spec.split("|"))


def prompts(count: int) -> list[tuple[str, str]]:
    tasks = ("specdec_humaneval", "specdec_mmlu_cot")
    pairs = zip_longest(*[[(t, p) for p in task_prompts(t)] for t in tasks])
    return [item for pair in pairs for item in pair if item is not None][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--drafts", nargs="+", default=DRAFTS)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 lets two such jobs share 2 cores)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--resume", action="store_true", help="continue from the figures already in --out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_target("smollm2-135m-instruct", kernels="plain")
    reference_model, tokenizer = loaded.model, loaded.tokenizer
    target = copy.deepcopy(reference_model)
    kernels.apply(target, "onednn")
    drafters = {spec: load_draft(_in_repo(spec), Target(target, tokenizer)) for spec in args.drafts}
    report = {"prompts": 0, "new_tokens": args.new_tokens, "num_draft_tokens": args.num_draft_tokens,
              "by_draft": {spec: {"checked": 0, "identical": 0, "mismatches": []} for spec in args.drafts},
              "by_task": {}, "seconds": 0.0}
    if args.resume:
        report = json.loads(args.out.read_text())
        if (set(report["by_draft"]), report["new_tokens"], report["num_draft_tokens"]) != (
                set(args.drafts), args.new_tokens, args.num_draft_tokens):
            sys.exit(f"error: {args.out} was made with other drafts or settings: rerun without --resume")
    start = time.perf_counter() - report["seconds"]
    for task, prompt in tqdm(prompts(args.prompts)[report["prompts"]:], desc="prompts", file=sys.stderr):
        ids = tokenizer(prompt).input_ids[-512:]  # MMLU-CoT's five shots: the last 512 tokens keep prefill short
        with torch.inference_mode():
            out = reference_model.generate(torch.tensor([ids]),
                                           attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                           max_new_tokens=args.new_tokens, do_sample=False,
                                           pad_token_id=tokenizer.eos_token_id)
        expected = out[0, len(ids):].tolist()
        report["prompts"] += 1
        report["by_task"][task] = report["by_task"].get(task, 0) + 1
        for spec, drafter in drafters.items():
            got, _ = speculative_generate(target, drafter, ids, args.new_tokens, num_draft_tokens=args.num_draft_tokens,
                                          dynamic_gamma=True)
            entry = report["by_draft"][spec]
            entry["checked"] += 1
            if got == expected:
                entry["identical"] += 1
            else:
                where = divergence(target, ids, got, expected) or Divergence()
                entry["mismatches"].append(replace(where, task=task).to_json())
        report["seconds"] = round(time.perf_counter() - start, 1)
        if args.out and report["prompts"] % 10 == 0:  # figures so far, should the run be stopped
            write_json(args.out, report)
    if args.out:
        write_json(args.out, report)
    print(json.dumps(report, indent=1))
    sys.exit(0 if all(e["identical"] == e["checked"] for e in report["by_draft"].values()) else 1)


if __name__ == "__main__":
    main()
