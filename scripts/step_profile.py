"""Where one decoding step's milliseconds go in our engine, at batch 1, 4, 8 and 16, plain and speculative.

    python scripts/step_profile.py [--batch-sizes 1,4,8,16] [--widths 1,5] [--repeats 5] [--out FILE]

For each batch size the target (the embedded default, float32, the default CPU kernels) prefills that many held-out
HumanEval prompts (only timed: nothing
learns from them). Then, per width (1: a plain step; 5: a γ-4 verification), it times ``verify_step`` as the
loop calls it (every row proposes width - 1 tokens), rolling the cache back after each, under torch's profiler. Each
operator's own CPU time goes to a category: the target's matrix multiplies, attention, KV-cache writes and copies,
norms and activations, sampling and acceptance, the rest; what the operators do not account for is Python and
dispatch. Medians over the repeats; prints a table and writes JSON (``benchmarks/step_profile/``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

CATEGORIES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "mkldnn", "onednn",
               "_linear", "packed"),
    "attention": ("scaled_dot_product", "softmax", "_flash_attention"),
    "cache writes": ("aten::cat", "aten::copy_", "aten::index_copy", "aten::index_put", "aten::slice_scatter",
                     "aten::gather", "aten::scatter", "aten::clone", "aten::contiguous"),
    "norms, activations": ("aten::mul", "aten::add", "aten::rsqrt", "aten::pow", "aten::mean", "aten::silu",
                           "aten::neg", "aten::sin", "aten::cos", "aten::embedding", "aten::div"),
    "acceptance": ("aten::argmax", "aten::max", "aten::eq", "aten::cumsum", "aten::searchsorted", "aten::where",
                   "aten::item", "aten::_local_scalar_dense", "aten::lt", "aten::all", "aten::cumprod"),
}
ORDER = [*CATEGORIES, "other operators", "python, dispatch"]


def category(name: str) -> str:
    for label, marks in CATEGORIES.items():
        if any(mark in name for mark in marks):
            return label
    return "other operators"


def step_breakdown(model, prompts: list[list[int]], width: int, repeats: int) -> dict:
    """Median milliseconds of one verification step of ``width`` columns per row, by category."""
    from specdraft_eval.engine.drafter import Proposal
    from specdraft_eval.engine.loop import prefill
    from specdraft_eval.engine.sampling import Sampler
    from specdraft_eval.engine.verify import verify_step

    cache = prefill(model, prompts)
    samplers = [Sampler() for _ in prompts]
    proposals = [Proposal([11] * (width - 1)) for _ in prompts]  # tokens that the target rejects: a full step
    runs = []
    for repeat in range(repeats + 1):
        mark = cache.mark()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            verify_step(model, cache, prompts, proposals, samplers)
            wall = (time.perf_counter() - start) * 1000
        cache.restore(mark)
        if repeat == 0:
            continue  # warm-up
        parts: dict[str, float] = defaultdict(float)
        for event in prof.key_averages():
            parts[category(event.key)] += event.self_cpu_time_total / 1000
        parts["python, dispatch"] = max(wall - sum(parts.values()), 0.0)
        runs.append({"wall": wall, **parts})
    return {key: statistics.median(r.get(key, 0.0) for r in runs) for key in ["wall", *ORDER]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    parser.add_argument("--widths", default="1,5")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernels", default="onednn")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from specdraft_eval.integration.offline_data import task_prompts
    from specdraft_eval.models.targets import load_target

    target = load_target("smollm2-135m-instruct", kernels=args.kernels)
    texts = task_prompts("specdec_humaneval")
    encoded = [target.tokenizer(text)["input_ids"] for text in texts]
    rows = []
    with torch.inference_mode():
        for size in [int(b) for b in args.batch_sizes.split(",")]:
            for width in [int(w) for w in args.widths.split(",")]:
                found = step_breakdown(target.model, encoded[:size], width, args.repeats)
                rows.append({"batch_size": size, "width": width, "tokens": size * width, **found})
    header = f"{'batch':>5} {'width':>5} {'ms/step':>8} {'ms/token':>8}  " + "  ".join(f"{c[:12]:>12}" for c in ORDER)
    print(header)
    for row in rows:
        print(f"{row['batch_size']:>5} {row['width']:>5} {row['wall']:>8.1f} {row['wall'] / row['tokens']:>8.2f}  "
              + "  ".join(f"{row[c]:>12.1f}" for c in ORDER))
    if args.out:
        from specdraft_eval.files import write_json
        from specdraft_eval.measure.environment import hardware

        write_json(args.out, {"command": "python scripts/step_profile.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v is not None),
            "hardware": hardware(target.model.device), "threads": torch.get_num_threads(), "rows": rows})


if __name__ == "__main__":
    main()
