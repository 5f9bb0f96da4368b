"""Loading drafts: ``load_draft("prompt-lookup" | "layers:0-3,29" | "ngram:DIR" | MODEL | "A|B", target)``.

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
from specdraft_eval.models.targets import Target

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


def load_draft(spec: str | DraftSpec, target: Target) -> Drafter:
    """Build the draft named by ``spec`` for ``target`` (:class:`~specdraft_eval.models.targets.Target`).
    ``A|B`` is a :class:`~specdraft_eval.drafts.composite.CompositeDrafter` (B drafts where A finds nothing); a
    separate causal LM loads with the target's settings (device, dtype, kernels) and must share its tokenizer.
    ``auto`` is resolved before loading (:func:`specdraft_eval.integration.recommend.resolve_auto`)."""
    kinds = draft_kinds()
    spec = spec if isinstance(spec, DraftSpec) else DraftSpec.parse(spec, kinds)
    if spec.kind == COMPOSITE:
        return CompositeDrafter([load_draft(part, target) for part in spec.parts])
    if spec.kind == AUTO:
        raise SpecdecError("draft 'auto' names no draft until it is resolved for a target: resolve it with "
                           "specdraft_eval.integration.recommend.resolve_auto(target), or name a draft")
    if spec.kind != MODEL:
        return kinds[spec.kind].build(spec.value, target)
    name = spec.arg
    try:
        loaded = target.settings.load(name)
    except SpecdecError as exc:
        raise SpecdecError(f"draft {name!r}: {exc}; draft kinds are {', '.join(kinds)}") from exc
    check_tokenizers(target.tokenizer, loaded.tokenizer, name)
    model = loaded.model
    vocab = min(target.model.config.vocab_size, model.config.vocab_size)
    return ModelDrafter(model, name, vocab, _draft_vocab(name))


def _draft_vocab(spec: str) -> list[int] | None:
    """The reduced-head token ids a ``zoo prune --vocab-top`` directory carries, if any."""
    path = Path(os.path.expanduser(spec)) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"draft {spec!r}: unreadable {DRAFT_VOCAB_FILE} ({exc}); rebuild it with zoo "
                           "prune") from None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise SpecdecError(f"draft {spec!r}: {DRAFT_VOCAB_FILE} must be a non-empty list of token ids")
    return ids
