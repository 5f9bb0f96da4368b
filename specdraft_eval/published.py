"""The published measurements this package ships: ``leaderboard/results`` and the drafts they name.

In a checkout they are the repository's ``leaderboard/`` folder; an installed wheel carries the same files under
``specdraft_eval/_published/leaderboard/`` (see ``pyproject.toml``). Draft paths written in published records
(``leaderboard/drafts/...``) resolve against :func:`base`, so ``draft=auto``, ``zoo recommend`` and ``zoo rank``
answer the same from any working directory, cloned or installed.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def base() -> Path:
    """The folder that holds ``leaderboard/`` (the wheel's copy, else the repository's)."""
    packaged = _PACKAGE / "_published"
    return packaged if packaged.is_dir() else _PACKAGE.parent


def results() -> Path:
    """The published results folder."""
    return base() / "leaderboard" / "results"
