"""How long-running zoo functions report progress: a ``Tick`` they call with ``total=N`` once, then per unit done.
The CLI turns it into a progress bar; library callers may ignore it."""

from __future__ import annotations

from typing import Protocol


class Tick(Protocol):
    def __call__(self, advance: int = 1, total: int | None = None) -> None: ...


def no_progress(advance: int = 1, total: int | None = None) -> None:
    """A :class:`Tick` that shows nothing."""
