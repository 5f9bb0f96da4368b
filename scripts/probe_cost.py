"""What dynamic γ costs a batch where drafting does not pay: its steps timed against plain decoding's, in one process.

    python scripts/probe_cost.py [--draft eagle:leaderboard/drafts/smollm2-eagle] [--batch-size 16] [--rounds 8]
                                 [--max-new-tokens 32] [--json benchmarks/probe_cost/eagle_b16.json]

Decodes the first B held-out HumanEval prompts (last 512 tokens each) as one batch, greedy, three ways alternated
round by round (the order reversed every other round): plain decoding (the engine's loop with no draft), the draft
attached at γ 0 every step (its features tapped, its state kept, never drafting), one probe (γ 1 for one row at the
first step, as dynamic γ's, then γ 0: whether a probe leaves a cost behind it), and dynamic γ (a fresh controller
per run, as ``zoo bench`` gives each repeat). Each step is clocked from one ``next_step`` to the next, so prefill
is left out. Prints each way's decoding seconds (median [min–max] over the rounds), the median of the rounds' paired
ratios of plain seconds over each way's (1.0: as fast as plain; goal 3 of issue 66 asks ≥ 0.97 for dynamic γ), and
the steps where dynamic γ's median differs from γ 0's by more than 4 ms, with the γ it asked for there, and what
the one probe's steps after its first two cost against γ 0's (paired by round).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdraft_eval.drafts import load_draft
from specdraft_eval.engine.gamma import GammaController
from specdraft_eval.engine.loop import NoDraft, speculative_generate_batch
from specdraft_eval.engine.params import FixedGamma
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import load_target
from zoo.measure.prompts import batch_prompts, check_positive


class Clocked:
    """A γ controller with each step's start clocked and each step's asked tokens kept."""

    def __init__(self, inner: GammaController | FixedGamma) -> None:
        self.inner, self.max_num_draft_tokens = inner, inner.max_num_draft_tokens
        self.starts: list[float] = []
        self.asked: list[int] = []

    def next_step(self, rows: int, prober: int = 0) -> list[int]:
        self.starts.append(time.perf_counter())
        gammas = self.inner.next_step(rows, prober)
        self.asked.append(sum(gammas))
        return gammas

    def update(self, *measured, asked=None) -> None:
        self.inner.update(*measured, asked=asked)


class OneProbe(FixedGamma):
    """γ 1 for the named row at the first step (dynamic γ's first probe in a batch), then γ 0."""

    def __init__(self) -> None:
        super().__init__(1)
        self.steps = 0

    def next_step(self, rows: int, prober: int = 0) -> list[int]:
        self.steps += 1
        return [int(self.steps == 1 and row == prober) for row in range(rows)]


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default="eagle:leaderboard/drafts/smollm2-eagle")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = args.batch_size
    try:
        texts = batch_prompts("specdec_humaneval", rows)
        check_positive(rounds=args.rounds, max_new_tokens=args.max_new_tokens)
        target = load_target("smollm2-135m-instruct", kernels="onednn")
        draft = load_draft(args.draft, target)
    except SpecdecError as exc:
        raise SystemExit(f"error: {exc}") from None
    ids = [target.tokenizer(text).input_ids[-512:] for text in texts]
    ways = {"plain": (NoDraft, lambda: FixedGamma(1)), "γ 0": (draft.fresh, lambda: FixedGamma(0)),
            "one probe": (draft.fresh, OneProbe), "dynamic γ": (draft.fresh, lambda: GammaController.around(4))}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    steps: dict[str, list[list[float]]] = {way: [] for way in ways}
    asked: list[list[int]] = []
    with torch.inference_mode():
        for round_ in range(args.rounds + 1):  # the first round warms up
            for way in list(ways) if round_ % 2 else list(ways)[::-1]:
                fresh, controller = ways[way]
                clocked = Clocked(controller())
                speculative_generate_batch(target.model, fresh(), ids, args.max_new_tokens, gamma_controller=clocked)
                ends = [*clocked.starts[1:], time.perf_counter()]
                if round_:
                    steps[way].append([end - start for start, end in zip(clocked.starts, ends, strict=True)])
                    seconds[way].append(sum(steps[way][-1]))
                    if way == "dynamic γ":
                        asked.append(clocked.asked)
    ratios = {way: spread([p / s for p, s in zip(seconds["plain"], seconds[way], strict=True)]) for way in ways}
    print(f"batch {rows}, {args.draft}, {args.max_new_tokens} tokens: decoding seconds, median [min–max] of "
          f"{args.rounds} alternated rounds; plain/way: the rounds' paired ratios' median")
    for way in ways:
        s = spread(seconds[way])
        print(f"{way:10s} {s['median']:.3f} [{s['min']:.3f}–{s['max']:.3f}]  plain/way {ratios[way]['median']:.3f} "
              f"[{ratios[way]['min']:.3f}–{ratios[way]['max']:.3f}]")
    differing = []
    for index in range(min(len(run) for way in ("γ 0", "dynamic γ") for run in steps[way])):
        diff = statistics.median(run[index] for run in steps["dynamic γ"]) - statistics.median(
            run[index] for run in steps["γ 0"])
        if abs(diff) > 0.004:
            differing.append({"step": index, "ms": 1000 * diff, "asked": [run[index] for run in asked]})
            print(f"step {index}: dynamic γ {1000 * diff:+.1f} ms against γ 0; tokens asked by round "
                  f"{differing[-1]['asked']}")
    pairs = zip(steps["one probe"], steps["γ 0"], strict=True)
    after = spread([sum(probe[2:]) - sum(zero[2:]) for probe, zero in pairs])
    print(f"one probe's steps 2 on against γ 0's: {after['median']:+.3f} s "
          f"[{after['min']:+.3f} to {after['max']:+.3f}]")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"command": f"python scripts/probe_cost.py --draft {args.draft} --batch-size {rows} --rounds "
                        f"{args.rounds} --max-new-tokens {args.max_new_tokens} --json {args.json}",
             "batch_size": rows, "draft": args.draft, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
             "task": "specdec_humaneval", "seconds": {way: spread(v) for way, v in seconds.items()},
             "plain_over_way": ratios, "differing_steps": differing,
             "one_probe_steps_2_on_minus_gamma_0_seconds": after}, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
