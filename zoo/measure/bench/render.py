"""``zoo bench``'s rows as text tables (median [min–max]): the comparison's and the batch study's."""

from __future__ import annotations

from specdraft_eval.results.profiles import Spread
from zoo.measure.bench.batch import BatchStudy
from zoo.measure.bench.result import BenchResult


def spread_text(s: Spread | None, fmt: str) -> str | None:
    """``median [min–max]`` in ``fmt``."""
    return None if s is None else f"{s.median:{fmt}} [{s.min:{fmt}}–{s.max:{fmt}}]"


def _pct(x: float | None) -> str | None:
    return None if x is None else f"{100 * x:+.1f}%"


def table_rows(result: BenchResult) -> list[dict]:
    """The result as flat rows for the CLI's table (its only reader)."""
    return [{
        "engine": r.engine, "draft": r.draft, "tok/s": spread_text(r.tokens_per_second, ".2f"),
        "kernels": r.kernels, **({"compiled": r.compiled, "warm-up s": round(r.warm_up_seconds, 1),
                                  "timed compiles": r.timed_compiles} if result.compile else {}),
        "×AR": spread_text(r.vs_autoregressive, ".2f"),
        "×ours plain": spread_text(r.vs_ours_plain, ".2f"),
        "×assisted": spread_text(r.vs_assisted, ".2f"), "×plain assisted": spread_text(r.vs_plain_assisted, ".2f"),
        "TAR": r.steps.tar, "mean γ": r.steps.mean_gamma, "draft ms/tok": r.steps.draft_ms_per_token,
        "verify ms/step": r.steps.verify_ms_per_step, "overhead": _pct(r.overhead),
        "peak MB": r.peak_mb, "same tokens": r.identical, "numerics": r.numerics,
    } for r in result.configs]


def batch_rows(result: BatchStudy) -> list[dict]:
    """The batch study as flat rows for the CLI's table (its only reader)."""
    return [{"draft": r.draft, "γ": r.gamma, "batch": r.batch_size, "tok/s": spread_text(r.tokens_per_second, ".1f"),
             "plain tok/s": spread_text(r.plain_tokens_per_second, ".1f"), "speedup": round(r.speedup, 2),
             "TAR": round(r.tar, 2) if r.tar else None,
             "mean γ": round(r.mean_gamma, 2) if r.mean_gamma is not None else None,
             "draft ms/pass": round(r.draft_ms_per_pass, 1), "reads/pass": round(r.host_reads_per_pass or 0, 2),
             "peak MB": round(r.peak_mb), "plain peak MB": round(r.plain_peak_mb)} for r in result.rows]
