"""The one exception type users see, its one-line rendering, and SIGTERM turned into an interruption."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class SpecdecError(ValueError):
    """Bad input or an unusable model/draft; the message names the problem and the fix."""


def one_line(exc: BaseException) -> str:
    """Render an error as a single line for a CLI."""
    text = " ".join(str(exc).split())
    return f"specdec: error: {text}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` and atomic write cleans up on the way out."""


def raise_terminated(signum, frame) -> None:
    """A SIGTERM handler: raise :class:`Terminated`."""
    raise Terminated()


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` in the main thread (elsewhere: nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_exit_code(exc: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
