"""Cost of one verification forward of k draft tokens, as a chain and as a token tree, relative to one
autoregressive step, per kernel path.

Both kernel paths are loaded in one process and every (kernels, shape, k) is timed interleaved (k = 0 is the
autoregressive step: one token on top of the cache), so the ratios compare like with like on a noisy machine.
A tree is EAGLE-2-like (top-4, 6 deep: ``zoo.measure.timing.filler``) and runs the engine's tree path (a 4D ancestor
mask, positions by depth). Usage:

    python scripts/verify_cost.py [--target smollm2-135m-instruct] [--context 106] [--repeats 15] [--ks 0,1,2,4,8]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from tabulate import tabulate

from specdraft_eval.engine import kv_cache
from specdraft_eval.engine.loop import prefill
from specdraft_eval.files import write_json
from specdraft_eval.measure.environment import hardware
from specdraft_eval.measure.timers import clock
from specdraft_eval.models import kernels
from specdraft_eval.models.targets import load_target
from zoo.measure.timing import filler

KS = "0,1,2,4,8,16,32,64"
SHAPES = ("chain", "tree")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=106, help="tokens in the cache before each forward")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--ks", default=KS, help="draft tokens (tree nodes) to verify, comma-separated")
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    models = {name: load_target(args.target, kernels=name).model for name in kernels.KERNELS}
    context = list(range(100, 100 + args.context))
    caches = {name: prefill(model, [context]) for name, model in models.items()}
    times: dict[tuple[str, str, int], list[float]] = {(n, shape, k): [] for n in models for shape in SHAPES
                                                      for k in ks}
    with torch.inference_mode():
        for repeat in range(args.repeats + 2):  # two warm-up rounds
            for k in ks:
                for shape in SHAPES[: 1 if k < 2 else 2]:  # a tree of fewer than 2 nodes is a chain
                    for name, model in models.items():
                        proposal = filler(context[-1], k, shape == "tree")
                        trees = [[-1, *(1 + p for p in proposal.tree)]] if proposal.parents else None
                        start = clock(model.device)
                        caches[name].forward(model, [[context[-1], *proposal.tokens]], k + 1, trees=trees)
                        if repeat >= 2:
                            times[(name, shape, k)].append(clock(model.device) - start)
                        kv_cache.rollback(caches[name].cache, len(context) - 1)
    step = {n: statistics.median(times[(n, "chain", 0)]) for n in models}
    rows = [{"kernels": n, "shape": shape, "k": k, "ms": statistics.median(times[(n, shape, k)]) * 1000,
             "min ms": min(times[(n, shape, k)]) * 1000, "max ms": max(times[(n, shape, k)]) * 1000,
             "× own step": statistics.median(times[(n, shape, k)]) / step[n],
             "× plain step": statistics.median(times[(n, shape, k)]) / step["plain"]}
            for n in models for shape in SHAPES for k in ks if shape == "chain" or k > 1]
    print(f"{args.target} on {hardware('cpu')}, {torch.get_num_threads()} threads, context {args.context}, "
          f"medians of {args.repeats} (k = 0: one autoregressive step)")
    print(tabulate(rows, headers="keys", floatfmt=".3g"))
    if args.out:
        write_json(args.out, {"target": args.target, "hardware": hardware("cpu"), "threads": torch.get_num_threads(),
                              "context": args.context, "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
