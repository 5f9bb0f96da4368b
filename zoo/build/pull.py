"""``zoo pull``: download a draft into the Hugging Face cache with huggingface_hub."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from specdraft_eval.errors import SpecdecError
from zoo.build import catalog
from zoo.build.built import Pulled


def _interruptible(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on a worker thread, waited for in short joins: Ctrl-C and SIGTERM reach the main
    thread at once, instead of after the hub client's download pool has finished its files (its ``with`` block
    waits for them); ``zoo``'s error handler then exits without waiting either."""
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 (handed to the main thread below)
            outcome["error"] = exc

    worker = threading.Thread(target=work)  # not a daemon, so neither are its download workers: `zoo` sees them
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _partial_files(repo_id: str) -> set[Path]:
    """The hub client's temporary ``.incomplete`` blobs for ``repo_id`` in the Hugging Face cache."""
    from huggingface_hub.constants import HF_HUB_CACHE

    return set((Path(HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "blobs").glob("*.incomplete"))


def _remove_partial_files(repo_id: str, before: set[Path]) -> None:
    """Delete the partial files this pull started: the hub client names each download uniquely and never reuses
    one, and ``zoo`` exits without waiting for its workers to clean up (files already complete are kept)."""
    for partial in _partial_files(repo_id) - before:
        partial.unlink(missing_ok=True)


def pull(name: str, revision: str | None = None, target: str | None = None) -> Pulled:
    """Download (or, offline, find in the cache) ``name``; check its tokenizer against ``target``."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    entry = catalog.find(name)
    repo_id = entry.hub_id if entry else name
    if "/" not in repo_id:
        raise SpecdecError(f"unknown draft {name!r}: give a catalog name (`zoo list`) or a hub id such as org/name")
    before = _partial_files(repo_id)
    try:
        path = _interruptible(snapshot_download, repo_id, revision=revision)
    except KeyboardInterrupt:
        _remove_partial_files(repo_id, before)
        raise
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise SpecdecError(f"{repo_id}{'@' + revision if revision else ''} is not on the hub: check the name and "
                           "revision") from exc
    except LocalEntryNotFoundError as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise SpecdecError(f"{repo_id} is not in the Hugging Face cache and {why}: pull it where the hub is "
                           "reachable") from exc
    except HFValidationError as exc:
        raise SpecdecError(f"bad hub id {repo_id!r}: use org/name") from exc
    except OSError as exc:
        raise SpecdecError(f"cannot download {repo_id}: {exc}") from exc
    if target is None:
        return Pulled(repo_id, path, revision or "main")
    from transformers import AutoTokenizer

    from specdraft_eval.drafts import check_tokenizers
    from specdraft_eval.models.targets import load_target

    check_tokenizers(load_target(target).tokenizer, AutoTokenizer.from_pretrained(path), repo_id)
    return Pulled(repo_id, path, revision or "main", f"matches {target}")
