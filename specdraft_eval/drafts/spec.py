"""The draft string, parsed once: ``KIND[:ARG]``, a model name, ``A|B`` (a composite) or ``auto``.

``DraftSpec.parse`` is the one parser: loading (:func:`specdraft_eval.drafts.load_draft`), ``draft=auto``, the
vLLM mapping and the zoo's model shapes all read its fields. Kinds come from the ``specdraft_eval.drafts``
entry-point group (another package adds one by declaring ``KIND = "pkg.module:build"`` there, where
``build(arg, target)`` (a :class:`~specdraft_eval.models.targets.Target`) returns a :class:`~specdraft_eval.engine.drafter.Drafter`). A kind whose argument
is a directory says so with ``build.path_marker = FILE`` (a file every such directory holds): the directory named
on its own then parses as that kind; one whose argument may be a path says which with ``build.path_of(arg)`` (the
path, or None). Anything else names a separate causal LM (kind ``model``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from specdraft_eval.errors import SpecdecError

ENTRY_POINT_GROUP = "specdraft_eval.drafts"
SEPARATOR = "|"
MODEL, COMPOSITE, AUTO = "model", "composite", "auto"


def split_shape(arg: str) -> tuple[str, str | None]:
    """A kind's argument and the tree shape after its last ``@`` (``DIR@4x6`` -> ``DIR``, ``4x6``); None when
    there is none, or when the whole argument is an existing path."""
    where, _, shape = arg.rpartition("@")
    if not where or Path(os.path.expanduser(arg)).exists():
        return arg, None
    return where, shape


def draft_kinds() -> dict[str, Callable]:
    """Kind name -> builder, for every kind declared in the entry-point group (this package's own included)."""
    return {ep.name: ep.load() for ep in entry_points(group=ENTRY_POINT_GROUP)}


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft string. ``kind`` is a registered kind, ``model`` (``arg`` is the model's name),
    ``composite`` (``parts`` in order) or ``auto``."""

    kind: str
    arg: str | None = None
    parts: tuple[DraftSpec, ...] = ()

    @classmethod
    def parse(cls, text: str, kinds: dict[str, Callable] | None = None) -> DraftSpec:
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
        if text == AUTO:
            return cls(AUTO)
        for name, build in kinds.items():  # a directory a kind recognises, named on its own (e.g. `zoo ngram`'s)
            marker = getattr(build, "path_marker", None)
            if marker and (Path(os.path.expanduser(text)) / marker).is_file():
                return cls(name, text)
        kind, _, arg = text.partition(":")
        if kind in kinds:
            return cls(kind, arg or None)
        return cls(MODEL, text)

    @property
    def name(self) -> str:
        """The draft string this spec was parsed from (parts joined by ``|``)."""
        if self.kind == COMPOSITE:
            return SEPARATOR.join(part.name for part in self.parts)
        if self.kind == MODEL:
            return self.arg or ""
        return self.kind + (f":{self.arg}" if self.arg else "")

    def leaves(self) -> tuple[DraftSpec, ...]:
        """The non-composite parts (the spec itself when it is not a composite)."""
        return self.parts if self.kind == COMPOSITE else (self,)

    def _where(self) -> tuple[str, str]:
        """A directory argument and its tree shape suffix (``DIR@4x6`` -> ``DIR``, ``@4x6``; none: ``""``)."""
        where, shape = split_shape(self.arg or "")
        return where, "" if shape is None else "@" + shape

    def path(self, kinds: dict[str, Callable] | None = None) -> Path | None:
        """The file or folder a non-composite draft needs: a model path, or a kind's directory argument
        (``path_marker``; without a tree shape ``@...``); None for kinds without files."""
        if self.kind == MODEL:
            return Path(os.path.expanduser(self.arg))
        kinds = draft_kinds() if kinds is None else kinds
        build = kinds.get(self.kind)
        if self.arg and getattr(build, "path_marker", None):
            return Path(os.path.expanduser(self._where()[0]))
        where = getattr(build, "path_of", lambda arg: None)(self.arg) if self.arg else None
        return Path(os.path.expanduser(where)) if where else None

    def with_path(self, path: Path) -> DraftSpec:
        """This spec with its path argument replaced (e.g. made absolute), its tree shape kept."""
        return DraftSpec(self.kind, str(path) + (self._where()[1] if self.kind != MODEL else ""), self.parts)

    @classmethod
    def composite(cls, parts: list[DraftSpec]) -> DraftSpec:
        return parts[0] if len(parts) == 1 else cls(COMPOSITE, None, tuple(parts))
