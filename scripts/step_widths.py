"""One verification step's milliseconds at a batch size, by width, with and without issue 66's attention and cache
changes, side by side in one process.

    python scripts/step_widths.py [--batch-size 16] [--rounds 6] [--json benchmarks/step_profile/widths_b16.json]

Prefills the first B held-out HumanEval prompts (last 512 tokens each) into one batch cache, then times single
target passes of several shapes (every row 1 token; the first row 2, the others 1, as a probe; every row 2; every
row 5), each rolled back after it and followed by one real 1-token step (the cache grows as in decoding), under
four variants alternated round by round: as shipped; without folding grouped query heads
(``engine/attention.py``: transformers' sdpa copies the cache per query head); without the in-place cache
(``kv_cache.GrowingLayer``: ``DynamicLayer``'s ``torch.cat``); and neither. Prints medians [min–max] in ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicLayer

from specdraft_eval.engine import kv_cache
from specdraft_eval.engine.loop import prefill
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import load_target
from zoo.measure.prompts import batch_prompts, check_positive

VARIANTS = {"shipped": (True, True), "no fold": (False, True), "no in-place": (True, False), "neither": (False, False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = args.batch_size
    try:
        texts = batch_prompts("specdec_humaneval", rows)
        check_positive(rounds=args.rounds)
    except SpecdecError as exc:
        raise SystemExit(f"error: {exc}") from None
    target = load_target("smollm2-135m-instruct", kernels="onednn")
    ids = [target.tokenizer(p).input_ids[-512:] for p in texts]
    shapes = {"all 1": [1] * rows, "first 2": [2] + [1] * (rows - 1), "all 2": [2] * rows, "all 5": [5] * rows}
    folding, appending = kv_cache.grouped_queries, kv_cache.GrowingLayer.update
    times: dict[tuple[str, str], list[float]] = {(v, s): [] for v in VARIANTS for s in shapes}
    with torch.inference_mode():
        for round_ in range(args.rounds):
            order = list(VARIANTS) if round_ % 2 == 0 else list(VARIANTS)[::-1]
            for variant in order:
                fold, in_place = VARIANTS[variant]
                kv_cache.grouped_queries = folding if fold else (lambda width, masked: contextlib.nullcontext())
                kv_cache.GrowingLayer.update = appending if in_place else DynamicLayer.update
                cache = prefill(target.model, ids)
                for _ in range(3):
                    for shape, widths in shapes.items():
                        mark = cache.mark()
                        start = time.perf_counter()
                        cache.forward(target.model, [[7] * width for width in widths], max(widths))
                        times[(variant, shape)].append(time.perf_counter() - start)
                        cache.restore(mark)
                        cache.forward(target.model, [[7]] * rows, 1)
                        cache.keep([[0]] * rows)
    kv_cache.grouped_queries, kv_cache.GrowingLayer.update = folding, appending
    table = {variant: {shape: {"median_ms": 1000 * statistics.median(times[(variant, shape)]),
                               "min_ms": 1000 * min(times[(variant, shape)]),
                               "max_ms": 1000 * max(times[(variant, shape)]), "n": len(times[(variant, shape)])}
                       for shape in shapes} for variant in VARIANTS}
    print(f"batch {rows}: ms per target pass, median [min–max] over {args.rounds} alternated rounds × 3")
    print(f"{'variant':12s}" + "".join(f"{shape:>22s}" for shape in shapes))
    for variant, by_shape in table.items():
        print(f"{variant:12s}" + "".join(f"{c['median_ms']:8.1f} [{c['min_ms']:.0f}–{c['max_ms']:.0f}]".rjust(22)
                                         for c in by_shape.values()))
    if args.json:
        args.json.write_text(json.dumps({"batch_size": rows, "rounds": args.rounds, "prompt_tokens": 512,
                                         "task": "specdec_humaneval", "variants": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
