"""This machine's results store: every configuration the user measured here, as results files under the cache root.

``lm_eval --model specdec ... baseline=true`` runs, ``zoo tune`` and ``zoo bench`` add a file each
(:func:`save`: the record's own block in a results file of lm-eval's shape, written atomically, with a ``store``
block naming the store's format version and what wrote it), so ``draft=auto``, ``zoo recommend`` and ``zoo rank``
read the user's own measurements before anything published (:mod:`specdraft_eval.integration.recommend`).
``$SPECDRAFT_EVAL_CACHE`` moves it with the cache, ``$SPECDRAFT_EVAL_STORE`` on its own (a store shared by several
users, or a test's); ``zoo results`` lists and prunes it.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import RecordError, RecordWarning, cache_root, check_version, load_json, write_json
from specdraft_eval.results.record import ResultsFile, SpecdecRecord, read_results

STORE_VERSION = 1
ORIGINS = ("lm_eval", "zoo tune", "zoo bench")


def store_dir() -> Path:
    """Where the store lives: ``$SPECDRAFT_EVAL_STORE``, else ``results/`` under the cache root
    (``$SPECDRAFT_EVAL_CACHE``)."""
    return Path(os.environ.get("SPECDRAFT_EVAL_STORE") or cache_root() / "results")


@dataclass
class StoredResult:
    """One file of the store: its record (with the task scores lm-eval wrote), what wrote it, and when."""

    file: ResultsFile
    origin: str
    written: str

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def record(self) -> SpecdecRecord:
        return self.file.record


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_")[:60] or "draft"


def save(record: SpecdecRecord, origin: str, results: dict | None = None, replacing: Path | None = None) -> Path:
    """Add ``record`` to the store (atomically; a new file, or ``replacing`` one this process wrote, when a run's
    record grew) and return its path."""
    if origin not in ORIGINS:
        raise SpecdecError(f"unknown results-store origin {origin!r}: one of {', '.join(ORIGINS)}")
    now = datetime.now(timezone.utc)
    folder = store_dir() / _slug(record.target)
    stem = f"results_{now:%Y%m%dT%H%M%S%f}_{_slug(record.draft)}"
    path = replacing or folder / f"{stem}.json"
    for n in range(1, 1000):
        if replacing or not path.exists():
            break
        path = folder / f"{stem}-{n}.json"
    write_json(path, {"config": {"specdec": record.to_block()}, "results": results or {},
                      "date": now.timestamp(),
                      "store": {"version": STORE_VERSION, "origin": origin, "written": now.isoformat()}})
    return path


def _read(path: Path) -> StoredResult:
    data = load_json(path)
    store = data.get("store") if isinstance(data, dict) else None
    if not isinstance(store, dict):
        raise RecordError(f"{path}: not a results-store file (no store block); remove it from {store_dir()}")
    check_version(path, store.get("version"), STORE_VERSION, "results-store file")
    return StoredResult(read_results(path), str(store.get("origin", "?")), str(store.get("written", "")))


def entries(target: str | None = None) -> list[StoredResult]:
    """Every usable file of the store (optionally only ``target``'s), oldest first; an unusable one is skipped with
    one :class:`RecordWarning` naming it."""
    root = store_dir()
    found = []
    for path in sorted(root.rglob("results_*.json")) if root.is_dir() else ():
        try:
            stored = _read(path)
        except RecordError as exc:
            warnings.warn(f"skipping {exc}", RecordWarning, stacklevel=2)
            continue
        if target is None or stored.record.target == target:
            found.append(stored)
    return sorted(found, key=lambda s: s.written)


def paths(target: str | None = None) -> list[Path]:
    """The store's results files (for readers of results files: ``scan_results``)."""
    return [stored.path for stored in entries(target)]


def is_stale(record: SpecdecRecord, replaced: Callable[[SpecdecRecord], list[str]] = lambda record: []) -> bool:
    """Whether today's code no longer uses ``record``: an older schema, an older specdraft-eval, a runtime field
    unknown, or a draft kind whose implementation was replaced since (``replaced``: the layer that knows the kinds
    says which, :func:`specdraft_eval.drafts.spec.replaced`)."""
    from specdraft_eval.measure.environment import versions

    return (not record.current or record.code_version != versions().get("specdraft-eval")
            or bool(replaced(record)))


def prune(target: str | None = None, draft: str | None = None, stale: bool = False,
          everything: bool = False, replaced: Callable[[SpecdecRecord], list[str]] = lambda record: []) -> list[Path]:
    """Remove the store's files that match: ``target``'s and/or ``draft``'s, or with ``stale`` those that today's
    code no longer uses (:func:`is_stale`), or with ``everything`` all of them; return the removed paths. Nothing is
    removed without one of the four."""
    if not (target or draft or stale or everything):
        raise SpecdecError("zoo results --prune needs --target, --draft, --stale or --all: say what to remove")
    removed = []
    for stored in entries():
        record = stored.record
        if everything or ((target is None or record.target == target) and (draft is None or record.draft == draft)
                          and (not stale or is_stale(record, replaced))):
            stored.path.unlink(missing_ok=True)
            removed.append(stored.path)
    return removed
