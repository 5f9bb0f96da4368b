"""A run's record as the text table ``lm_eval --model specdec`` prints (the record: :mod:`record`)."""

from __future__ import annotations

from tabulate import tabulate

from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.results.record import SpecdecRecord

TABLE_COLUMNS = [
    ("task", "task"),
    ("tar", "TAR"),
    ("acceptance_rate", "accept"),
    ("acceptance_rate_per_position", "accept by position"),
    ("draft_ms_per_token", "draft ms/tok"),
    ("verify_ms_per_step", "verify ms/step"),
    ("tokens_per_second", "tok/s"),
    ("baseline_tokens_per_second", "base tok/s"),
    ("speedup", "speedup"),
    ("end_to_end_speedup", "e2e speedup"),
    ("predicted_tokens_per_second", "pred tok/s"),
]


ACCEPTANCE_COLUMNS = [
    ("task", "task"),
    ("mean_acceptance_length", "vLLM MAL"),
    ("conditional_acceptance_per_position", "SPEED-Bench conditional"),
    ("accept_length", "SGLang AL"),
    ("mean_accepted_tokens", "Spec-Bench MAT"),
    ("generated_tokens", "tokens"),
    ("overshoot_tokens", "overshoot"),
]
"""The second table: acceptance as other engines define it (docs/acceptance.md: MAL mean acceptance length, AL
accept length, MAT mean accepted tokens) and the output counted."""


def positions(rates: list[float | None] | None, most: int = 8) -> str | None:
    """Per-position acceptance rates compactly, e.g. ``0.62 0.41 - 0.17`` (``-``: undefined at that position); None
    when none is defined."""
    if not rates or all(r is None for r in rates):
        return None
    return " ".join("-" if r is None else f"{r:.2f}" for r in rates[:most]) + (" …" if len(rates) > most else "")


def _cells(task: str, stats: GenerationStats, predicted: float | None) -> list[str]:
    figures = {"task": task, "predicted_tokens_per_second": predicted}
    return [positions(stats.acceptance_rate_per_position) or "-" if key == "acceptance_rate_per_position"
            else _fmt(figures[key] if key in figures else getattr(stats, key)) for key, _ in TABLE_COLUMNS]


def _acceptance_cells(task: str, stats: GenerationStats) -> list[str]:
    figures = {"task": task, "conditional_acceptance_per_position":
               positions(stats.conditional_acceptance_per_position, 5) or "-"}
    return [figures[key] if key in figures else _fmt(getattr(stats, key)) for key, _ in ACCEPTANCE_COLUMNS]


def table(record: SpecdecRecord) -> str:
    """The record as two text tables (speed, then acceptance as other engines report it): one row per task and an
    ``all`` row."""
    tasks = sorted(record.per_task.items()) + ([("all", record.total)] if len(record.per_task) != 1 else [])
    body = [_cells(task, stats, record.predicted(stats)) for task, stats in tasks]
    acceptance = [_acceptance_cells(task, stats) for task, stats in tasks]
    title = f"specdec: target={record.target} draft={record.draft} num_draft_tokens={record.num_draft_tokens}"
    total = record.total
    if record.runtime.compile:
        title += (f" (compiled: {total.compile_seconds:.1f} s compiling and warming up, outside every figure; "
                  f"{total.recompiles} graphs compiled in timed steps)")
    return (title + "\n" + tabulate(body, headers=[h for _, h in TABLE_COLUMNS], tablefmt="github") + "\n"
            + tabulate(acceptance, headers=[h for _, h in ACCEPTANCE_COLUMNS], tablefmt="github",
                       disable_numparse=True))


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
