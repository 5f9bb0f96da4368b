"""Cost of one verification forward of k draft tokens, relative to one autoregressive step, per kernel path.

Both kernel paths are loaded in one process and timed interleaved (k = 0 is the autoregressive step: one
token on top of the cache), so the ratios compare like with like on a noisy machine. Usage:

    python scripts/verify_cost.py [--target smollm2-135m-instruct] [--context 106] [--repeats 15] [--out FILE]
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

KS = (0, 1, 2, 3, 4, 5, 6, 7, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=106, help="tokens in the cache before each forward")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args()
    models = {name: load_target(args.target, kernels=name).model for name in kernels.KERNELS}
    context = list(range(100, 100 + args.context))
    caches = {name: prefill(model, [context]).cache for name, model in models.items()}
    times: dict[tuple[str, int], list[float]] = {(n, k): [] for n in models for k in KS}
    with torch.inference_mode():
        for repeat in range(args.repeats + 2):  # two warm-up rounds
            for k in KS:
                for name, model in models.items():
                    start = clock(model.device)
                    kv_cache.forward(model, [context[-1]] * (k + 1), caches[name], k + 1)
                    if repeat >= 2:
                        times[(name, k)].append(clock(model.device) - start)
                    kv_cache.rollback(caches[name], len(context) - 1)
    step = {n: statistics.median(times[(n, 0)]) for n in models}
    rows = [{"kernels": n, "k": k, "ms": statistics.median(times[(n, k)]) * 1000,
             "min ms": min(times[(n, k)]) * 1000, "max ms": max(times[(n, k)]) * 1000,
             "× own step": statistics.median(times[(n, k)]) / step[n],
             "× plain step": statistics.median(times[(n, k)]) / step["plain"]} for n in models for k in KS]
    print(f"{args.target} on {hardware('cpu')}, {torch.get_num_threads()} threads, context {args.context}, "
          f"medians of {args.repeats} (k = 0: one autoregressive step)")
    print(tabulate(rows, headers="keys", floatfmt=".3g"))
    if args.out:
        write_json(args.out, {"target": args.target, "hardware": hardware("cpu"), "threads": torch.get_num_threads(),
                              "context": args.context, "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
