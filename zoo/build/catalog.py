"""The catalog of known drafts (``catalog.json``), grouped by the target family whose tokenizer they share."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from specdraft_eval.errors import SpecdecError

CATALOG = Path(__file__).with_name("catalog.json")


@dataclass(frozen=True)
class CatalogEntry:
    """A known draft or target: its name, hub id, family (the tokenizer it shares), shape and provenance."""

    name: str
    hub_id: str
    family: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    parameters_m: float
    source: str
    intermediate_size: int | None = None  # targets only: their MLP width
    licence: str | None = None  # drafts only

    @classmethod
    def of(cls, family: str, data: dict) -> CatalogEntry:
        return cls(family=family, **data)


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


def entries(target: str | None = None) -> list[CatalogEntry]:
    """Catalog drafts (with their family), only those for ``target``'s family when given."""
    families = load()["families"]
    if target is not None:
        family = family_of(target)
        if family is None:
            known = ", ".join(sorted(families))
            raise SpecdecError(f"no catalog family matches target {target!r}: known families are {known}")
        families = {family: families[family]}
    return [CatalogEntry.of(name, draft) for name, entry in families.items() for draft in entry["drafts"]]


def targets() -> list[CatalogEntry]:
    """Catalog targets (the founding paper's), with their family."""
    return [CatalogEntry.of(name, t) for name, entry in load()["families"].items() for t in entry.get("targets", [])]


def find(name: str) -> CatalogEntry | None:
    """The catalog draft or target named ``name`` or with hub id ``name`` (case-insensitive)."""
    lowered = name.lower()
    for entry in entries() + targets():
        if lowered in (entry.name.lower(), entry.hub_id.lower()):
            return entry
    return None


def vocab_size(family: str) -> int:
    return load()["families"][family]["vocab_size"]


@dataclass(frozen=True)
class Listing:
    """``zoo list``: catalog drafts and the draft kinds (``name``: usage, ``family``: any, ``source``: summary)."""

    drafts: list[CatalogEntry]
    kinds: list[dict[str, str]]

    def to_json(self) -> dict:
        return {"drafts": [asdict(entry) for entry in self.drafts], "kinds": self.kinds}


def listing(target: str | None) -> Listing:
    """Catalog drafts (for ``target``'s family, if given) and every registered draft kind."""
    from specdraft_eval.drafts.kind import draft_kinds

    return Listing(entries(target), [{"name": kind.usage or kind.name, "family": "any", "source": kind.summary}
                                     for kind in draft_kinds().values()])
