"""Prompts for the measuring commands: a bundled task's or a file's."""

from __future__ import annotations

import json
from pathlib import Path

from specdraft_eval.errors import SpecdecError


def load_prompts(task: str | None, prompts_file: Path | None, limit: int) -> list[str]:
    """``limit`` prompts from a bundled task or a file (a JSON list of strings, or JSON lines of strings
    or ``{"prompt": ...}`` objects)."""
    from specdraft_eval.integration.offline_data import task_prompts

    if task and prompts_file:
        raise SpecdecError("give --task or --prompts, not both")
    if limit < 1:
        raise SpecdecError(f"--limit {limit} must be >= 1")
    if prompts_file is None:
        return task_prompts(task or "specdec_humaneval")[:limit]
    try:
        text = prompts_file.read_text()
    except OSError as exc:
        raise SpecdecError(f"cannot read --prompts {prompts_file}: {exc.strerror}; give a JSON or JSONL file") from None
    try:
        lines = [json.loads(line) for line in text.splitlines() if line.strip()] if not text.lstrip().startswith("[") \
            else None
        items = json.loads(text) if lines is None else lines
    except ValueError as exc:
        raise SpecdecError(f"--prompts {prompts_file} is not JSON/JSONL ({exc}); use a list of strings or "
                           'lines such as {"prompt": "..."}') from None
    prompts = [item["prompt"] if isinstance(item, dict) and "prompt" in item else item for item in items]
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise SpecdecError(f"--prompts {prompts_file} must hold non-empty strings (or objects with a \"prompt\")")
    return prompts[:limit]


def check_positive(**counts: int) -> None:
    """A one-line error for the first count below 1, named as its option (``max_new_tokens`` ->
    ``--max-new-tokens``)."""
    for name, value in counts.items():
        if value < 1:
            raise SpecdecError(f"--{name.replace('_', '-')} {value} must be >= 1")


def batch_prompts(task: str, rows: int) -> list[str]:
    """The first ``rows`` prompts of bundled ``task``, for one batch of that many rows (a one-line error naming
    ``--batch-size`` if it holds fewer)."""
    check_positive(batch_size=rows)
    texts = load_prompts(task, None, rows)
    if len(texts) < rows:
        raise SpecdecError(f"--batch-size {rows}: {task} holds {len(texts)} prompts; give at most that")
    return texts
