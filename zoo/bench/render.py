"""``zoo bench``'s rows as a text table (median [min–max])."""

from __future__ import annotations

from specdraft_eval.measure.profiles import Spread
from zoo.bench.result import BenchResult


def _spread(s: Spread | None, fmt: str) -> str | None:
    return None if s is None else f"{s.median:{fmt}} [{s.min:{fmt}}–{s.max:{fmt}}]"


def _pct(x: float | None) -> str | None:
    return None if x is None else f"{100 * x:+.1f}%"


def table_rows(result: BenchResult) -> list[dict]:
    """The result as flat rows for the CLI's table (its only reader)."""
    return [{
        "engine": r.engine, "draft": r.draft, "tok/s": _spread(r.tokens_per_second, ".2f"),
        "kernels": r.kernels, "×AR": _spread(r.vs_autoregressive, ".2f"),
        "×ours plain": _spread(r.vs_ours_plain, ".2f"),
        "×assisted": _spread(r.vs_assisted, ".2f"), "×plain assisted": _spread(r.vs_plain_assisted, ".2f"),
        "TAR": r.steps.tar, "mean γ": r.steps.mean_gamma, "draft ms/tok": r.steps.draft_ms_per_token,
        "verify ms/step": r.steps.verify_ms_per_step, "overhead": _pct(r.overhead),
        "peak MB": r.peak_mb, "same tokens": r.identical, "numerics": r.numerics,
    } for r in result.configs]
