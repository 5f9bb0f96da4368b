"""A draft kind: everything the rest of the code knows about one kind, in the one object its module defines.

A kind module subclasses :class:`DraftKind` and declares an instance in the ``specdraft_eval.drafts`` entry-point
group (``NAME = "pkg.module:KIND"``; this package's own kinds included), or a program registers one with
:func:`register`. The draft-string parser, :func:`~specdraft_eval.drafts.load_draft`, the vLLM and SGLang mappings,
``zoo list``, ``zoo rank``'s shapes and tree depths and the tuner's candidates all ask the kind; no module outside a
kind's own switches on its name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from specdraft_eval.engine.drafter import Drafter
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.structure import KnownShape, ModelShape

ENTRY_POINT_GROUP = "specdraft_eval.drafts"
SERVER_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True)
class Candidate:
    """A configuration worth trying for a target: a draft string and the γ values (chain length or tree node budget)
    to try it at."""

    draft: str
    gammas: tuple[int, ...]


def split_shape(arg: str) -> tuple[str, str | None]:
    """A kind's argument and the tree shape after its last ``@`` (``DIR@4x6`` -> ``DIR``, ``4x6``); None when
    there is none, or when the whole argument is an existing path."""
    where, _, shape = arg.rpartition("@")
    if not where or Path(os.path.expanduser(arg)).exists():
        return arg, None
    return where, shape


class DraftKind:
    """One kind of draft. ``name`` is what draft strings call it (``NAME[:ARG]``); ``usage`` and ``summary`` are its
    line in ``zoo list``; ``path_marker``, a file every directory argument of the kind holds, makes such a directory
    named on its own parse as this kind. Override what the kind has: every method but :meth:`build` has a default."""

    name: str = ""
    usage: str = ""
    summary: str = ""
    path_marker: str | None = None
    version: int = 1
    """The implementation's version: raise it when a change makes the kind draft differently, so that records
    measured by the replaced implementation (:func:`replaced`) are found (``zoo results --stale``) and no longer
    chosen by ``draft=auto``."""
    parameters: tuple[str, ...] = ()
    """Settings of the kind that model_args may also give (``max_tree_depth=64``), folded into the draft string by
    :meth:`with_parameters`, so that the string alone names the configuration measured."""

    def parse(self, arg: str | None) -> Any:
        """The argument as this kind's typed value, validated (a one-line error naming the fix). Default: as is."""
        return arg

    def build(self, value: Any, target) -> Drafter:
        """The drafter for ``target`` (a :class:`~specdraft_eval.models.targets.Target`)."""
        raise NotImplementedError

    def load(self, arg: str | None, target) -> Drafter:
        """The drafter ``KIND:arg`` names, for ``target``: :meth:`parse` then :meth:`build`."""
        return self.build(self.parse(arg), target)

    def path(self, value: Any) -> str | None:
        """The file or folder the draft reads (without a tree shape), or None."""
        return None

    def with_path(self, value: Any, arg: str, path: Path) -> str:
        """The draft string with the file or folder it reads replaced by ``path``. Default: the argument is the path,
        with a tree shape after it kept."""
        shape = split_shape(arg)[1]
        return f"{self.name}:{path}" + ("" if shape is None else "@" + shape)

    def canonical(self, value: Any, written: str) -> str:
        """The draft's canonical string (``written`` is the string as given)."""
        return written

    def with_parameters(self, value: Any, given: dict) -> str:
        """The draft string of ``value`` with ``given`` (some of :attr:`parameters`, from model_args) applied."""
        raise NotImplementedError(f"draft kind {self.name!r} takes no parameters")

    def tree_depth(self, value: Any) -> int | None:
        """The depth of the token tree the draft grows one draft pass per depth (EAGLE-2), None for a chain."""
        return None

    def shape(self, value: Any, target: ModelShape, name: str) -> KnownShape:
        """The shape of the draft ``name`` (its canonical string) at ``target``'s. Default: model-free."""
        return KnownShape(name, None, "model-free")

    def candidates(self, target_layers: int) -> tuple[Candidate, ...]:
        """Configurations worth trying for a target of ``target_layers`` decoder layers, without files to build."""
        return ()

    def found_candidates(self, written: str) -> tuple[Candidate, ...]:
        """Configurations worth trying with a draft of this kind found on disk (``written``: its draft string)."""
        return (Candidate(written, (4,)),)

    def vllm_config(self, value: Any, num_draft_tokens: int, written: str) -> dict:
        """vLLM's ``speculative_config`` for the draft, or a one-line error saying what to serve instead."""
        raise SpecdecError(f"vLLM has no counterpart of draft kind {self.name!r} ({written}): serve a draft model or "
                           "prompt-lookup")

    def sglang_args(self, value: Any, num_draft_tokens: int, written: str) -> dict:
        """SGLang's server arguments for the draft, or a one-line error saying what to serve instead."""
        raise SpecdecError(f"SGLang has no counterpart of draft {written!r}: serve an EAGLE head or a draft model "
                           "there (vLLM maps more kinds: speculative_config)")


class Registry:
    """The kinds: the entry-point group's (loaded once) and those :func:`register` added in this process."""

    def __init__(self) -> None:
        self._declared: dict[str, DraftKind] | None = None
        self._added: dict[str, DraftKind] = {}

    def kinds(self) -> dict[str, DraftKind]:
        if self._declared is None:
            declared = {}
            for point in entry_points(group=ENTRY_POINT_GROUP):
                kind = point.load()
                kind = kind() if isinstance(kind, type) else kind
                if not isinstance(kind, DraftKind) or kind.name != point.name:
                    raise SpecdecError(f"draft kind entry point {point.name} = {point.value} is not a DraftKind named "
                                       f"{point.name!r}: point it at an instance of a DraftKind subclass")
                declared[point.name] = kind
            self._declared = declared
        return self._declared | self._added

    def add(self, kind: DraftKind) -> None:
        if not isinstance(kind, DraftKind) or not kind.name or ":" in kind.name or "|" in kind.name:
            raise SpecdecError(f"cannot register {kind!r}: give an instance of a DraftKind subclass whose name has no "
                               "':' or '|'")
        self._added[kind.name] = kind

    def remove(self, name: str) -> None:
        self._added.pop(name, None)


REGISTRY = Registry()


def draft_kinds() -> dict[str, DraftKind]:
    """Kind name -> kind, for every declared and registered kind."""
    return REGISTRY.kinds()


def register(kind: DraftKind) -> None:
    """Add ``kind`` for this process (a plugin distribution declares it as an entry point instead)."""
    REGISTRY.add(kind)



def all_candidates(target_layers: int) -> list[Candidate]:
    """Every kind's configurations worth trying for a target of ``target_layers`` decoder layers."""
    return [found for kind in draft_kinds().values() for found in kind.candidates(target_layers)]

