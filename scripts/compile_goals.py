"""Issue 37's goals, measured: the same ``lm_eval --model specdec`` command eager, with ``static_cache=true`` and
with ``compile=true``, one after the other. Each run gets a fresh inductor cache (compilation as a first-time user
pays it) unless ``--inductor-cache DIR`` is given: then the runs share it, and a second ``compile`` run shows what
a user pays once the compiled kernels are on disk.

    python scripts/compile_goals.py [--limit 20] [--draft prompt-lookup] [--out DIR] [--runs eager,static,compile]
                                    [--gamma 4 | --dynamic] [--inductor-cache DIR]

Per run: wall seconds (the whole command: loading, compilation, every document, spec and baseline), and from its
results file tokens/s, baseline tokens/s, speedup, ``compile_seconds`` and ``recompiles``. Writes ``DIR/goals.json``
after each run and prints the table with the ratios the issue names (steady state vs eager, wall vs eager).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
CACHE_SETTINGS = {"eager": "", "static": ",static_cache=true", "compile": ",compile=true"}
FIGURES = ("tokens_per_second", "baseline_tokens_per_second", "speedup", "tar", "compile_seconds", "recompiles",
           "baseline_mismatches")


def run(name: str, args: argparse.Namespace, out: Path) -> dict:
    gamma = ",dynamic_gamma=true" if args.dynamic else f",num_draft_tokens={args.gamma}"
    model_args = f"pretrained={args.target},draft={args.draft},baseline=true{gamma}{CACHE_SETTINGS[name]}"
    folder = out / name
    command = [str(Path(sys.executable).parent / "lm_eval"), "--model", "specdec", "--model_args", model_args,
               "--include_path", str(ROOT / "tasks"), "--tasks", args.task, "--limit", str(args.limit),
               "--confirm_run_unsafe_code", "--output_path", str(folder)]
    cache = args.inductor_cache or tempfile.mkdtemp(prefix="inductor-")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCHINDUCTOR_CACHE_DIR": cache}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    files = sorted(glob.glob(str(folder / "**" / "results_*.json"), recursive=True))
    if done.returncode or not files:
        raise SystemExit(f"{name}: lm_eval failed ({done.returncode}): {done.stderr[-1500:]}")
    block = json.loads(Path(files[-1]).read_text())["config"]["specdec"]
    return {"runtime": name, "model_args": model_args, "wall_s": round(wall, 1),
            **{k: block.get(k) for k in FIGURES}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--draft", default="prompt-lookup")
    parser.add_argument("--task", default="specdec_humaneval")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--dynamic", action="store_true", help="dynamic γ instead of a fixed one")
    parser.add_argument("--runs", default="eager,static,compile")
    parser.add_argument("--out", default="compile_goals_out")
    parser.add_argument("--inductor-cache", help="one inductor cache folder for every run (default: a fresh one each)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.runs.split(","):
        rows.append(run(name, args, out))
        (out / "goals.json").write_text(json.dumps(rows, indent=1) + "\n")
        print(f"{name}: {rows[-1]}", flush=True)
    eager = next((r for r in rows if r["runtime"] == "eager"), None)
    for row in rows:
        if eager and row is not eager:
            row["tok/s vs eager"] = round(row["tokens_per_second"] / eager["tokens_per_second"], 3)
            base = row["baseline_tokens_per_second"] / eager["baseline_tokens_per_second"]
            row["base tok/s vs eager"] = round(base, 3)
            row["wall vs eager"] = round(row["wall_s"] / eager["wall_s"], 3)
    keys = ["runtime", "wall_s", *FIGURES, "tok/s vs eager", "base tok/s vs eager", "wall vs eager"]
    print(tabulate([[r.get(k) for k in keys] for r in rows], headers=keys, tablefmt="github", floatfmt=".3g"))
    (out / "goals.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
