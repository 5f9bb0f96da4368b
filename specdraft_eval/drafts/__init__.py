"""The draft registry: ``load_draft("prompt-lookup" | "layers:0-3,29" | MODEL, target, tokenizer)``.

A draft string ``KIND[:ARG]`` names a kind from the ``specdraft_eval.drafts`` entry-point group (another
package adds a kind by declaring ``KIND = "pkg.module:build"`` there, where ``build(arg, target,
tokenizer)`` returns a :class:`~specdraft_eval.drafts.base.Drafter`). A kind whose argument is a directory says
so with ``build.path_marker = FILE`` (a file every such directory holds): ``auto`` then checks the directory
exists, and the directory named on its own loads as that kind. Anything else is a separate causal LM: an alias,
a local directory, a GGUF file or a hub id, whose tokenizer must match the target's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from specdraft_eval import kernels
from specdraft_eval.drafts.base import Drafter, Proposal
from specdraft_eval.drafts.composite import SEPARATOR, CompositeDrafter
from specdraft_eval.drafts.model import DRAFT_VOCAB_FILE, ModelDrafter
from specdraft_eval.errors import SpecdecError

ENTRY_POINT_GROUP = "specdraft_eval.drafts"
_BUILTIN = {
    "prompt-lookup": "specdraft_eval.drafts.prompt_lookup:build",
    "layers": "specdraft_eval.drafts.layers:build",
    "ngram": "specdraft_eval.drafts.ngram:build",
}

__all__ = ["Drafter", "Proposal", "ModelDrafter", "load_draft", "draft_kinds", "check_tokenizers"]


def draft_kinds() -> dict[str, Callable]:
    """Kind name -> builder, built-ins first, then installed plugins."""
    import importlib

    kinds: dict[str, Callable] = {}
    for name, target in _BUILTIN.items():
        module, attr = target.split(":")
        kinds[name] = getattr(importlib.import_module(module), attr)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in kinds:
            kinds[ep.name] = ep.load()
    return kinds


def check_tokenizers(target_tokenizer, draft_tokenizer, draft_name: str) -> None:
    """Raise unless both tokenizers map the same strings to the same ids."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        raise SpecdecError(
            f"tokenizer mismatch: draft {draft_name!r} has {len(draft_vocab)} tokens, the target "
            f"{len(target_vocab)} ({differing} entries differ); pick a draft of the target's family "
            "(`zoo list --target ...`)"
        )


def load_draft(spec: str, target, tokenizer) -> Drafter:
    """Build the draft named by ``spec`` for ``target`` (a loaded HF causal LM) and its tokenizer.
    ``A|B`` is a :class:`~specdraft_eval.drafts.composite.CompositeDrafter` (B drafts where A finds nothing)."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecdecError("empty draft: use draft=prompt-lookup, draft=layers:0-3,29 or a draft model name")
    spec = spec.strip()
    if SEPARATOR in spec:
        parts = [part.strip() for part in spec.split(SEPARATOR)]
        if not all(parts) or len(parts) < 2:
            raise SpecdecError(f"bad composite draft {spec!r}: name two or more drafts, e.g. draft=prompt-lookup|layers:0-4")
        return CompositeDrafter([load_draft(part, target, tokenizer) for part in parts])
    kind, _, arg = spec.partition(":")
    kinds = draft_kinds()
    for name, build in kinds.items():  # a directory a kind recognises, named on its own (e.g. `zoo ngram`'s)
        marker = getattr(build, "path_marker", None)
        if marker and (Path(os.path.expanduser(spec)) / marker).is_file():
            kind, arg = name, spec
            break
    if kind in kinds:
        return kinds[kind](arg or None, target, tokenizer)
    from specdraft_eval.targets import load_target

    dtype = str(target.dtype).removeprefix("torch.")
    try:
        model, draft_tokenizer = load_target(spec, device=str(target.device), dtype=dtype)
    except SpecdecError as exc:
        raise SpecdecError(f"draft {spec!r}: {exc}; draft kinds are {', '.join(kinds)}") from exc
    check_tokenizers(tokenizer, draft_tokenizer, spec)
    vocab = min(target.config.vocab_size, model.config.vocab_size)
    drafter = ModelDrafter(model, spec, vocab, _draft_vocab(spec))
    kernels.apply(model, kernels.kernels_of(target))  # the draft runs the target's kernels
    return drafter


def _draft_vocab(spec: str) -> list[int] | None:
    """The reduced-head token ids a ``zoo prune --vocab-top`` directory carries, if any."""
    path = Path(os.path.expanduser(spec)) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"draft {spec!r}: unreadable {DRAFT_VOCAB_FILE} ({exc}); rebuild it with zoo prune") from None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise SpecdecError(f"draft {spec!r}: {DRAFT_VOCAB_FILE} must be a non-empty list of token ids")
    return ids
