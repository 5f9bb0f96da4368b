"""Outputs and records of four ``lm_eval --model specdec`` runs at another revision against the working tree's.

    python scripts/compare_outputs.py REV [--new REV2] [--limit 3] [--max-gen-toks 48]

A refactoring must not change a token or a count: this runs the same runs (prompt lookup greedy with the plain
baseline, alone and in batches of 4; the shipped EAGLE head as a tree; seeded sampling with the suffix draft) from
REV, checked out as a temporary git worktree, and from this tree (or from ``--new``, another worktree),
``PYTHONPATH`` picking the code as in ``compare_revisions.py``. It compares each sample's generated text and each
record's counters, per task and in total. Timings (seconds, tokens/s, speedups, latencies, memory) differ from run
to run and are left out. Exit code 0 only when everything is equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_revisions import kinds_site  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = {  # name: model_args, gen_kwargs beyond the budget, lm_eval's batch size
    "prompt-lookup": ("draft=prompt-lookup,baseline=true", "", 1),
    "eagle-tree": ("draft=eagle:leaderboard/drafts/smollm2-eagle@2x3,num_draft_tokens=6", "", 1),
    "suffix-sampled": ("draft=suffix,baseline=true", "do_sample=True,temperature=0.8", 1),
    "prompt-lookup-batch-4": ("draft=prompt-lookup,baseline=true", "", 4),
}
TIMING = ("second", "latenc", "speedup", "time", "predicted", "memory", "tokens_per_s", "_ms", "ms_", "overhead",
          "versions", "hardware", "date")


def untimed(value):
    """``value`` without the keys whose figures are timings (or the machine's and packages' names)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in sorted(value.items()) if not any(t in k for t in TIMING)}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def run(code: Path, site: Path, name: str, out: Path, limit: int, max_gen_toks: int) -> dict:
    """One run from ``code``: its samples' outputs and its specdec record without timings."""
    model_args, sampling, batch_size = RUNS[name]
    gen = f"max_gen_toks={max_gen_toks}" + (f",{sampling}" if sampling else "")
    argv = ["lm_eval", "--model", "specdec", "--model_args", f"pretrained=smollm2-135m-instruct,{model_args}",
            "--include_path", str(code / "tasks"), "--tasks", "specdec_humaneval", "--limit", str(limit),
            "--gen_kwargs", gen, "--confirm_run_unsafe_code", "--seed", "1234", "--log_samples",
            "--batch_size", str(batch_size),
            "--output_path", str(out)]
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.argv = {argv!r}; "
                           "from lm_eval.__main__ import cli_evaluate; cli_evaluate()"],
                          env={**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{site}"}, capture_output=True,
                          text=True, cwd=code)
    if done.returncode:
        raise SystemExit(f"{name} failed in {code}: {done.stderr.strip().splitlines()[-1]}")
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = [json.loads(line) for line in next(out.rglob("samples_*.jsonl")).read_text().splitlines()]
    return {"outputs": {s["doc_id"]: s["resps"] for s in samples},
            "record": untimed(results["config"]["specdec"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("--new", default=None, help="a revision to compare instead of the working tree")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-gen-toks", type=int, default=48)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        old, new = scratch / "old", (scratch / "new" if args.new else ROOT)
        for where, rev in ((old, args.rev), (new, args.new)):
            if rev:
                subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=ROOT, check=True,
                               capture_output=True)
        try:
            sides = {label: (code, kinds_site(code, scratch / f"site-{label}")) for label, code in
                     (("old", old), ("new", new))}
            differ = 0
            for name in RUNS:
                found = {label: run(code, site, name, scratch / f"{label}-{name}", args.limit, args.max_gen_toks)
                         for label, (code, site) in sides.items()}
                same_out = found["old"]["outputs"] == found["new"]["outputs"]
                same_rec = found["old"]["record"] == found["new"]["record"]
                differ += not (same_out and same_rec)
                print(f"{name:15s} outputs {'equal' if same_out else 'DIFFER'} ({len(found['new']['outputs'])} "
                      f"samples), record {'equal' if same_rec else 'DIFFERS'}")
                if not same_rec:
                    for key in sorted(set(found["old"]["record"]) | set(found["new"]["record"])):
                        if found["old"]["record"].get(key) != found["new"]["record"].get(key):
                            print(f"  {key}: {found['old']['record'].get(key)!r:.80} -> "
                                  f"{found['new']['record'].get(key)!r:.80}")
        finally:
            for where in {old, new} - {ROOT}:
                subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, capture_output=True)
    raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
