"""The draft string, parsed once: ``KIND[:ARG]``, a model name, ``A|B`` (a composite) or ``auto``.

``DraftSpec.parse`` is the one parser: loading (:func:`specdraft_eval.drafts.load_draft`), ``draft=auto``, the
vLLM mapping and the zoo's model shapes all read its fields. A registered kind's argument is parsed once, by the
kind (:class:`~specdraft_eval.drafts.kind.DraftKind`), into ``value``; a directory holding a kind's
``path_marker`` named on its own parses as that kind. Anything else names a separate causal LM (kind ``model``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdraft_eval.drafts.kind import DraftKind, draft_kinds
from specdraft_eval.errors import SpecdecError

SEPARATOR = "|"
MODEL, COMPOSITE, AUTO = "model", "composite", "auto"
AUTO_FIXED = "fixed"  # auto:fixed: look measured results up, never tune


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft string. ``kind`` is a registered kind, ``model`` (``arg`` is the model's name),
    ``composite`` (``parts`` in order) or ``auto``; ``value`` is a kind's argument as the kind parsed it."""

    kind: str
    arg: str | None = None
    parts: tuple[DraftSpec, ...] = ()
    value: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str, kinds: dict[str, DraftKind] | None = None) -> DraftSpec:
        if not isinstance(text, str) or not text.strip():
            raise SpecdecError("empty draft: use draft=prompt-lookup, draft=layers:0-3,29 or a draft model name")
        text = text.strip()
        kinds = draft_kinds() if kinds is None else kinds
        if SEPARATOR in text:
            parts = [part.strip() for part in text.split(SEPARATOR)]
            if not all(parts) or len(parts) < 2:
                raise SpecdecError(f"bad composite draft {text!r}: name two or more drafts, "
                                   "e.g. draft=prompt-lookup|layers:0-4")
            return cls(COMPOSITE, None, tuple(cls.parse(part, kinds) for part in parts))
        if text == AUTO or text.startswith(AUTO + ":"):
            mode = text.partition(":")[2] or None
            if mode not in (None, AUTO_FIXED):
                raise SpecdecError(f"unknown draft {text!r}: auto (measure here when nothing was) or auto:fixed (only "
                                   "what was measured, else prompt lookup)")
            return cls(AUTO, mode)
        for name, kind in kinds.items():  # a directory a kind recognises, named on its own (e.g. `zoo ngram`'s)
            if kind.path_marker and (Path(os.path.expanduser(text)) / kind.path_marker).is_file():
                return cls(name, text, value=kind.parse(text))
        head, query, settings = text.partition("?")  # KIND?settings: a kind's parameters, no argument needed
        name, _, arg = head.partition(":")
        arg += query + settings
        if name in kinds:
            return cls(name, arg or None, value=kinds[name].parse(arg or None))
        return cls(MODEL, text)

    @property
    def name(self) -> str:
        """The draft string this spec was parsed from (parts joined by ``|``)."""
        if self.kind == COMPOSITE:
            return SEPARATOR.join(part.name for part in self.parts)
        if self.kind == MODEL:
            return self.arg or ""
        return self.kind + ("" if not self.arg else self.arg if self.arg.startswith("?") else f":{self.arg}")

    def leaves(self) -> tuple[DraftSpec, ...]:
        """The non-composite parts (the spec itself when it is not a composite)."""
        return self.parts if self.kind == COMPOSITE else (self,)

    def path(self, kinds: dict[str, DraftKind] | None = None) -> Path | None:
        """The file or folder a non-composite draft needs: a model path, or the one its kind reads (without a tree
        shape ``@...``); None for kinds without files."""
        if self.kind == MODEL:
            return Path(os.path.expanduser(self.arg))
        kinds = draft_kinds() if kinds is None else kinds
        where = kinds[self.kind].path(self.value) if self.kind in kinds else None
        return Path(os.path.expanduser(where)) if where else None

    def with_path(self, path: Path) -> DraftSpec:
        """This spec with its path argument replaced (e.g. made absolute), the rest kept (the kind's
        :meth:`~specdraft_eval.drafts.kind.DraftKind.with_path`)."""
        if self.kind == MODEL:
            return DraftSpec(MODEL, str(path))
        return DraftSpec.parse(draft_kinds()[self.kind].with_path(self.value, self.arg or "", path))

    def with_parameters(self, given: dict, kinds: dict[str, DraftKind] | None = None) -> str:
        """The draft string with kind parameters from model_args (``given``: name -> value) applied to every part
        of a kind that takes them, or a one-line error naming a parameter no part takes."""
        kinds = draft_kinds() if kinds is None else kinds
        if not given:
            return self.name
        parts, applied = [], set()
        for leaf in self.leaves():
            kind = kinds.get(leaf.kind)
            mine = {name: value for name, value in given.items() if kind is not None and name in kind.parameters}
            parts.append(kind.with_parameters(leaf.value, mine) if mine else leaf.name)
            applied |= set(mine)
        for name in set(given) - applied:
            owner = next(kind.name for kind in kinds.values() if name in kind.parameters)
            raise SpecdecError(f"model_args {name} is a setting of draft kind {owner!r}, which draft {self.name!r} "
                               f"has no part of: name a {owner} draft or leave it out")
        return SEPARATOR.join(parts)

    @classmethod
    def composite(cls, parts: list[DraftSpec]) -> DraftSpec:
        return parts[0] if len(parts) == 1 else cls(COMPOSITE, None, tuple(parts))


def kind_versions(draft: str) -> dict[str, int]:
    """The implementation version of each registered kind ``draft`` uses, for a record's ``kind_versions``: those
    past version 1 only (a kind missing is version 1, as in files from before versions were recorded, so that both
    merge)."""
    kinds = draft_kinds()
    spec = DraftSpec.parse(draft, kinds)
    return {} if spec.kind == AUTO else {leaf.kind: kinds[leaf.kind].version for leaf in spec.leaves()
                                         if leaf.kind in kinds and kinds[leaf.kind].version != 1}


def replaced(draft: str, recorded: dict[str, int]) -> list[str]:
    """The kinds of ``draft`` whose implementation changed since a record with ``recorded`` versions was measured
    (a kind missing from ``recorded``: version 1), as ``kind vN (now vM)``; [] when none did or the draft no longer
    parses."""
    kinds = draft_kinds()
    try:
        used = {leaf.kind for leaf in DraftSpec.parse(draft, kinds).leaves() if leaf.kind in kinds}
    except SpecdecError:
        return []
    return [f"{kind} v{recorded.get(kind, 1)} (now v{kinds[kind].version})" for kind in sorted(used)
            if recorded.get(kind, 1) != kinds[kind].version]
