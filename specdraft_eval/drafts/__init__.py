"""Loading drafts: ``load_draft("prompt-lookup" | "layers:0-3,29" | "ngram:DIR" | MODEL | "A|B", target, tokenizer)``.

The draft string is parsed by :class:`~specdraft_eval.drafts.spec.DraftSpec` (kinds, composites, model names);
a separate causal LM (an alias, a local directory, a GGUF file or a hub id) must share the target's tokenizer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specdraft_eval.drafts.composite import CompositeDrafter
from specdraft_eval.drafts.model import DRAFT_VOCAB_FILE, ModelDrafter
from specdraft_eval.drafts.spec import AUTO, COMPOSITE, MODEL, DraftSpec, draft_kinds
from specdraft_eval.engine.drafter import Drafter, Proposal
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models import kernels

__all__ = ["Drafter", "Proposal", "ModelDrafter", "DraftSpec", "load_draft", "draft_kinds", "check_tokenizers"]


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


def load_draft(spec: str | DraftSpec, target, tokenizer) -> Drafter:
    """Build the draft named by ``spec`` for ``target`` (a loaded HF causal LM) and its tokenizer.
    ``A|B`` is a :class:`~specdraft_eval.drafts.composite.CompositeDrafter` (B drafts where A finds nothing)."""
    kinds = draft_kinds()
    spec = spec if isinstance(spec, DraftSpec) else DraftSpec.parse(spec, kinds)
    if spec.kind == COMPOSITE:
        return CompositeDrafter([load_draft(part, target, tokenizer) for part in spec.parts])
    if spec.kind == AUTO:
        return load_draft(resolve_auto(target).draft, target, tokenizer)
    if spec.kind != MODEL:
        return kinds[spec.kind](spec.arg, target, tokenizer)
    from specdraft_eval.models.targets import load_target

    name = spec.arg
    dtype = str(target.dtype).removeprefix("torch.")
    try:
        model, draft_tokenizer = load_target(name, device=str(target.device), dtype=dtype,
                                             use_kernels=getattr(target, "specdraft_use_kernels", False))
    except SpecdecError as exc:
        raise SpecdecError(f"draft {name!r}: {exc}; draft kinds are {', '.join(kinds)}") from exc
    check_tokenizers(tokenizer, draft_tokenizer, name)
    vocab = min(target.config.vocab_size, model.config.vocab_size)
    drafter = ModelDrafter(model, name, vocab, _draft_vocab(name))
    kernels.apply(model, kernels.kernels_of(target))  # the draft runs the target's kernels
    return drafter


def resolve_auto(target):
    """What ``auto`` means for ``target`` on its device (:func:`specdraft_eval.integration.recommend.recommend`)."""
    from specdraft_eval.integration.recommend import recommend
    from specdraft_eval.measure.environment import hardware

    name = getattr(target, "specdraft_name", None)
    if name is None:
        raise SpecdecError("draft=auto needs a target loaded by specdraft_eval.load_target (its name picks the "
                           "results): load it so, or name a draft")
    return recommend(name, hardware=hardware(target.device))


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
