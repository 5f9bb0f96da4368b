"""Files the project writes and reads: one atomic writer, JSON with a version check, the cache root.

Every file the package writes goes through :func:`atomic_output` (or :func:`atomic_write` /
:func:`write_json` on top of it), so an error or an interruption never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdraft_eval.errors import SpecdecError


class RecordError(SpecdecError):
    """A results, profile or calibration file that cannot be used; the message names the file and the fix."""


class RecordWarning(UserWarning):
    """An unusable file skipped where a command reads many (the CLIs print it as one line)."""


def cache_root() -> Path:
    """Where converted models, profiles and calibrations live (``$SPECDRAFT_EVAL_CACHE``, else
    ``~/.cache/specdraft_eval``)."""
    return Path(os.environ.get("SPECDRAFT_EVAL_CACHE", Path.home() / ".cache" / "specdraft_eval"))


@contextmanager
def atomic_output(path: Path, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary file or folder beside ``path``; on success it replaces ``path`` in one rename, on any
    error or interruption it is removed, so ``path`` is never half-written. Files in a folder get the umask's
    permissions (writers such as safetensors' create theirs 0600, which would hide a published draft)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide a published draft from other users
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        tmp.chmod(0o666 & ~umask)  # mkstemp's 0600 would hide a published page or profile from other users
    try:
        yield tmp
        for file in tmp.rglob("*") if directory else ():
            if file.is_file():
                file.chmod(0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write text or bytes to ``path`` atomically."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def write_json(path: Path, data: dict | list) -> None:
    """Write ``data`` as indented, key-sorted JSON, atomically."""
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_json(path: Path) -> object:
    """Parse a JSON file, or raise :class:`RecordError` naming it."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RecordError(f"{path}: not readable JSON ({reason}): the file is corrupt or truncated; "
                          "regenerate or remove it") from None


def check_version(path: Path, found, current: int, what: str) -> None:
    """Refuse a file that is not of this format (``found`` not a version) or is newer than this package reads."""
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise RecordError(f"{path}: not a {what} (schema version {found!r}); remove it from the input")
    if found > current:
        raise RecordError(f"{path}: written by a newer specdraft-eval ({what} schema {found} > {current}); "
                          "upgrade specdraft-eval to read it")
