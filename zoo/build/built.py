"""What the zoo's builders hand back: :class:`Built` (``zoo prune``, ``zoo ngram``, ``zoo train-head``) and
:class:`Pulled` (``zoo pull``), typed, with the JSON the CLI prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Built:
    """A draft a builder wrote: its directory, the draft string that loads it, and the figures of the record it wrote
    beside the weights (kept layers and distillation, the n-gram counts, the head's training)."""

    out: str
    draft: str
    record: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"out": self.out, "draft": self.draft, **self.record}


@dataclass(frozen=True)
class Pulled:
    """A draft ``zoo pull`` fetched (or found in the cache offline): its hub id, local path, revision and the result
    of the tokenizer check against a target."""

    draft: str
    path: str
    revision: str
    tokenizer_check: str = "skipped"

    def to_json(self) -> dict:
        return asdict(self)
