"""The one exception type users see, and its one-line rendering."""

from __future__ import annotations


class SpecdecError(ValueError):
    """Bad input or an unusable model/draft; the message names the problem and the fix."""


def one_line(exc: BaseException) -> str:
    """Render an error as a single line for a CLI."""
    text = " ".join(str(exc).split())
    return f"specdec: error: {text}"
