"""A run's record as the text table ``lm_eval --model specdec`` prints (the record: :mod:`record`)."""

from __future__ import annotations

from tabulate import tabulate

from specdraft_eval.measure.record import SpecdecRecord
from specdraft_eval.measure.stats import GenerationStats

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
    ("predicted_tokens_per_second", "pred tok/s"),
]


def positions(rates: list[float] | None, most: int = 8) -> str | None:
    """Per-position acceptance rates compactly, e.g. ``0.62 0.41 0.28 0.17``."""
    if not rates:
        return None
    return " ".join(f"{r:.2f}" for r in rates[:most]) + (" …" if len(rates) > most else "")


def _cells(task: str, stats: GenerationStats, predicted: float | None) -> list[str]:
    figures = {"task": task, "predicted_tokens_per_second": predicted}
    return [positions(stats.acceptance_rate_per_position) or "-" if key == "acceptance_rate_per_position"
            else _fmt(figures[key] if key in figures else getattr(stats, key)) for key, _ in TABLE_COLUMNS]


def table(record: SpecdecRecord) -> str:
    """The record as a text table: one row per task and an ``all`` row."""
    body = [_cells(task, stats, record.predicted(stats)) for task, stats in sorted(record.per_task.items())]
    if len(body) != 1:
        body.append(_cells("all", record.total, record.predicted(record.total)))
    title = f"specdec: target={record.target} draft={record.draft} num_draft_tokens={record.num_draft_tokens}"
    total = record.total
    if record.runtime.compile:
        title += (f" (compiled: {total.compile_seconds:.1f} s compiling and warming up, outside every figure; "
                  f"{total.recompiles} graphs compiled in timed steps)")
    return title + "\n" + tabulate(body, headers=[h for _, h in TABLE_COLUMNS], tablefmt="github")


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
