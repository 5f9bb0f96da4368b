"""Our engine's speed at another revision against the working tree's, measured side by side.

    python scripts/compare_revisions.py REV [--rounds 3] [--drafts prompt-lookup] [--limit 2] [--max-new-tokens 64]
                                        [--batch-sizes 1,4,8 [--gamma dynamic]]

Checks REV out as a temporary git worktree and runs ``zoo bench --json`` alternately from it and from this tree
(``PYTHONPATH`` picks the code; the same environment, kernels and prompts), ``--rounds`` times each. Prints, per
configuration of our engine, the median tokens/s of each side over the rounds (min–max beside) and the ratio of
the medians: a layout change should leave it at 1.0 within this machine's noise. With ``--batch-sizes``, ``zoo
bench --batch-size`` runs instead: speculative and plain tokens/s of each draft at each batch size and the speedup
(the median over a run's repeats of speculative over plain, measured side by side; ``--gamma``: its γs, e.g.
``2,dynamic``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("specdraft", "specdraft dynamic γ", "specdraft plain")


def kinds_site(code: Path, site: Path) -> Path:
    """A site folder declaring the draft kinds as ``code``'s own ``pyproject.toml`` declares them: on ``PYTHONPATH``
    after the code and before the installed package, it makes each revision load its own kinds' entry points."""
    import tomllib

    declared = tomllib.loads((code / "pyproject.toml").read_text())["project"]["entry-points"]["specdraft_eval.drafts"]
    info = site / "specdraft_eval-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specdraft_eval\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[specdraft_eval.drafts]\n"
                                           + "".join(f"{name} = {value}\n" for name, value in declared.items()))
    return site


def bench(code: Path, args: argparse.Namespace, site: Path) -> dict[tuple[str, str | None], float]:
    """One ``zoo bench`` run of the code under ``code`` (its kinds declared by ``site``): tokens/s (median over its
    repeats) per engine and draft."""
    argv = ["zoo", "bench", "--target", args.target, "--limit", str(args.limit), "--repeats", "1",
            "--max-new-tokens", str(args.max_new_tokens), "--json"] + [a for d in args.drafts for a in ("--drafts", d)]
    if args.batch_sizes:
        argv += ["--batch-size", args.batch_sizes] + (["--gamma", args.gamma] if args.gamma else [])
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.argv = {argv!r}; from zoo.cli import app; app()"],
                          env={**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{site}"}, capture_output=True,
                          text=True, cwd=code)
    if done.returncode:
        raise SystemExit(f"zoo bench failed in {code}: {done.stderr.strip().splitlines()[-1]}")
    found = json.loads(done.stdout)
    if args.batch_sizes:
        return {(f"b{r['batch_size']} γ {r['gamma']} {side}", r["draft"]): r[key]["median"] if side != "speedup"
                else r[key] for r in found["rows"]
                for side, key in (("specdraft", "tokens_per_second"), ("plain", "plain_tokens_per_second"),
                                  ("speedup", "speedup"))}
    rows = found["configs"]
    return {(r["engine"], r["draft"]): r["tokens_per_second"]["median"] for r in rows if r["engine"] in OURS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafts", action="append", default=None)
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default=None, help="e.g. 1,4,8: the batch study instead")
    parser.add_argument("--gamma", default=None, help="with --batch-sizes: γs, e.g. 4,dynamic")
    args = parser.parse_args()
    args.drafts = args.drafts or ["prompt-lookup"]
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "rev"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(other), args.rev],
                       check=True, capture_output=True)
        try:
            sites = {"rev": kinds_site(other, Path(tmp) / "rev-site"),
                     "tree": kinds_site(ROOT, Path(tmp) / "tree-site")}
            runs: dict[str, list[dict]] = {"rev": [], "tree": []}
            for _ in range(args.rounds):  # alternated, so a drift of the machine hits both sides alike
                runs["rev"].append(bench(other, args, sites["rev"]))
                runs["tree"].append(bench(ROOT, args, sites["tree"]))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], capture_output=True)
    print(f"tokens/s, median [min–max] over {args.rounds} alternated rounds; {args.rev} vs this tree")
    for key in runs["tree"][0]:
        old, new = ([r[key] for r in runs[side]] for side in ("rev", "tree"))
        print(f"{key[0]:28s} {key[1] or '-':18s} {statistics.median(old):7.2f} [{min(old):.2f}–{max(old):.2f}]  "
              f"{statistics.median(new):7.2f} [{min(new):.2f}–{max(new):.2f}]  "
              f"ratio {statistics.median(new) / statistics.median(old):.3f}")


if __name__ == "__main__":
    main()
