"""The catalog of known drafts (``catalog.json``), grouped by the target family whose tokenizer they share."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from specdraft_eval.errors import SpecdecError

CATALOG = Path(__file__).with_name("catalog.json")


@lru_cache(maxsize=1)
def load() -> dict:
    return json.loads(CATALOG.read_text())


def family_of(target: str) -> str | None:
    """The family whose name patterns match ``target`` (an alias, hub id or path), if any."""
    lowered = target.lower()
    for family, entry in load()["families"].items():
        if any(pattern in lowered for pattern in entry["match"]):
            return family
    return None


def entries(target: str | None = None) -> list[dict]:
    """Catalog drafts (with their family), only those for ``target``'s family when given."""
    families = load()["families"]
    if target is not None:
        family = family_of(target)
        if family is None:
            known = ", ".join(sorted(families))
            raise SpecdecError(f"no catalog family matches target {target!r}: known families are {known}")
        families = {family: families[family]}
    return [{"family": name, **draft} for name, entry in families.items() for draft in entry["drafts"]]


def targets() -> list[dict]:
    """Catalog targets (the founding paper's), with their family."""
    return [{"family": name, **t} for name, entry in load()["families"].items() for t in entry.get("targets", [])]


def find(name: str) -> dict | None:
    """The catalog draft or target named ``name`` or with hub id ``name`` (case-insensitive)."""
    lowered = name.lower()
    for entry in entries() + targets():
        if lowered in (entry["name"].lower(), entry["hub_id"].lower()):
            return entry
    return None


def vocab_size(family: str) -> int:
    return load()["families"][family]["vocab_size"]


def listing(target: str | None) -> dict:
    """``zoo list``: catalog drafts (for ``target``'s family, if given) and the training-free kinds."""
    return {"drafts": entries(target),
            "training_free": [{"name": d["name"], "family": "any", "source": d["source"]}
                              for d in load()["training_free"]]}
