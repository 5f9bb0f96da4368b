"""Soak: many generation requests in one process; resident memory after warm-up, and no state between requests.

Each request is one of a few prompts, in an order that gives every prompt different predecessors; the
output and the counters of a prompt (everything but timings) must be the same every time it is asked.

  .venv/bin/python scripts/soak.py --requests 500 --out benchmarks/lossless/soak.json      (embedded default, ~10 min)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from specdraft_eval.engine.loop import speculative_generate
from specdraft_eval.files import atomic_write


def rss_mib() -> float:
    """This process's resident memory (Linux /proc)."""
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def soak(target, drafter, prompts: list[list[int]], requests: int, new_tokens: int, warmup: int = 50,
         num_draft_tokens: int = 4, progress: bool = False) -> dict:
    """Run ``requests`` greedy requests (prompts in a shuffled order, fixed seed); memory and leak figures."""
    order = [i % len(prompts) for i in range(requests)]
    random.Random(0).shuffle(order)
    seen: dict[int, tuple] = {}
    differing, predecessors = [], {i: set() for i in range(len(prompts))}
    rss, previous = [], None
    for n, i in enumerate(tqdm(order, desc="requests", file=sys.stderr, disable=not progress)):
        out, stats = speculative_generate(target, drafter, prompts[i], new_tokens, num_draft_tokens=num_draft_tokens)
        counters = {k: v for k, v in stats.as_dict().items() if not k.endswith("_seconds")}  # no timings
        if i in seen and seen[i] != (out, counters):
            differing.append({"request": n, "prompt": i, "after": previous})
        seen.setdefault(i, (out, counters))
        predecessors[i].add(previous)
        previous = i
        if n + 1 == warmup or (n + 1) % 50 == 0:
            rss.append((n + 1, round(rss_mib(), 1)))
    after_warmup = next(m for k, m in rss if k >= warmup)
    return {"requests": requests, "prompts": len(prompts), "new_tokens": new_tokens,
            "distinct_predecessors_min": min(len(p) for p in predecessors.values()),
            "requests_differing_from_first_answer": differing,
            "rss_mib_by_request": rss, "rss_after_warmup_mib": after_warmup, "rss_end_mib": rss[-1][1],
            "rss_growth_after_warmup": round(rss[-1][1] / after_warmup - 1, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--draft", default="prompt-lookup")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 lets two such jobs share 2 cores)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from specdraft_eval.drafts import load_draft
    from specdraft_eval.integration.offline_data import task_prompts
    from specdraft_eval.models.targets import load_target

    torch.set_num_threads(args.threads)
    loaded = load_target("smollm2-135m-instruct", kernels="onednn")
    target, tokenizer = loaded.model, loaded.tokenizer
    drafter = load_draft(args.draft, loaded)
    prompts = [tokenizer(p).input_ids for p in task_prompts("specdec_humaneval")[:10]]
    report = {"target": "smollm2-135m-instruct", "draft": args.draft,
              **soak(target, drafter, prompts, args.requests, args.new_tokens, progress=True)}
    text = json.dumps(report, indent=1)
    if args.out:
        atomic_write(args.out, text + "\n")
    print(text)
    ok = not report["requests_differing_from_first_answer"] and report["rss_growth_after_warmup"] < 0.05
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
