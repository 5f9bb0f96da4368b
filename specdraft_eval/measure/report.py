"""The ``specdec`` block as the text table ``lm_eval --model specdec`` prints (the block: :mod:`record`)."""

from __future__ import annotations

from tabulate import tabulate

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


def table(block: dict) -> str:
    """The block as a text table: one row per task and an ``all`` row."""
    rows = [{"task": task, **figures} for task, figures in block["per_task"].items()]
    if len(rows) != 1:
        rows.append({"task": "all", **block})
    body = [[_fmt(row.get(key)) if key != "acceptance_rate_per_position" else positions(row.get(key)) or "-"
             for key, _ in TABLE_COLUMNS] for row in rows]
    title = f"specdec: target={block['target']} draft={block['draft']} num_draft_tokens={block['num_draft_tokens']}"
    return title + "\n" + tabulate(body, headers=[h for _, h in TABLE_COLUMNS], tablefmt="github")


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
