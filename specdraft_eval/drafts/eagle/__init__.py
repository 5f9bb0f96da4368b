"""``eagle:DIR``: a feature-level draft head (EAGLE, EAGLE-2, EAGLE-3) that reads the target's own hidden states.

One decoder layer as wide as the target drafts from the target's features of the tokens so far and the next
token's embedding, then from its own predicted features for the rest of the γ tokens; the engine hands it the
target's hidden states of every position the target keeps (:meth:`EagleDrafter.observe`), so no second target
pass is needed. Layouts read (all ``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``):

- **EAGLE / EAGLE-2** (the EAGLE repository; also what ``zoo train-head`` writes, with ``eagle.json`` beside it):
  ``fc`` over [embedding ‖ feature] (2H -> H), ``layers.0`` a Llama decoder layer whose input norm is skipped,
  no final norm, the target's own output head (ours: the rows of its reduced vocabulary, ``token_ids``). The
  feature is the target's last hidden state after its final norm.
- **EAGLE-3** (vLLM ``speculators``: ``speculators_model_type: eagle3``, or the EAGLE repository's ``midlayer``
  keys): ``fc`` over three of the target's layer inputs (3H -> H; layers 2, L/2, L-3 unless
  ``eagle_aux_hidden_state_layer_ids`` says otherwise), a decoder layer over [norm(embedding) ‖ norm(hidden)] (2H
  attention input), a final ``norm`` and its own ``lm_head`` over a draft vocabulary mapped to the target's by
  ``d2t`` (target id = draft id + d2t[draft id]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from specdraft_eval.drafts.eagle.drafter import EagleDrafter, TreeShape, split
from specdraft_eval.drafts.eagle.formats import HEAD_FILE, _directory, describe, load_head
from specdraft_eval.drafts.eagle.module import (
    EAGLE,
    EAGLE3,
    EagleHead,
    HeadLayout,
    head_config,
    new_eagle3_head,
    new_head,
)
from specdraft_eval.drafts.eagle.servers import TOKEN_MAP, server_differences
from specdraft_eval.drafts.kind import SERVER_NAMES, Candidate, DraftKind
from specdraft_eval.engine.drafter import static_tree
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.structure import KnownShape, ModelShape
from specdraft_eval.models.targets import Target

__all__ = ["EAGLE", "EAGLE3", "KIND", "EagleDrafter", "EagleHead", "EagleKind", "HeadLayout", "TreeShape",
           "head_config", "new_eagle3_head", "new_head", "server_differences"]


@dataclass(frozen=True)
class HeadArg:
    """``eagle:ARG`` parsed: the head (a directory or hub id) and its tree shape (None: a chain)."""

    arg: str
    where: str
    tree: TreeShape | None


class EagleKind(DraftKind):
    """``eagle:DIR`` (a directory or a hub id; drafts a chain) and ``eagle:DIR@K`` / ``eagle:DIR@KxD`` (EAGLE-2's
    dynamic tree: top-k K per step, D deep; γ is its node budget). The value is a :class:`HeadArg`."""

    name = "eagle"
    usage = "eagle:DIR[@K[xD]]"
    summary = "an EAGLE/EAGLE-3 feature-level head (`zoo train-head` builds DIR; or a hub id)"
    path_marker = HEAD_FILE

    def parse(self, arg: str | None) -> HeadArg:
        if not arg:
            raise SpecdecError("eagle needs a head: e.g. draft=eagle:DIR (built by `zoo train-head TARGET --out DIR`)")
        return HeadArg(arg, *split(arg))

    def build(self, value: HeadArg, target: Target) -> EagleDrafter:
        head, layout = load_head(_directory(value.where), target.model, target.tokenizer)
        return EagleDrafter(head, target.model, f"eagle:{value.arg}", layout.token_ids, value.tree)

    def path(self, value: HeadArg) -> str:
        return value.where

    def tree_depth(self, value: HeadArg) -> int | None:
        return value.tree.depth if value.tree else None

    def found_candidates(self, written: str) -> tuple[Candidate, ...]:
        """The head's EAGLE-2 tree (top-2, 4 deep, 6 nodes: the board's best shape here) and its chain."""
        head = written if written.startswith(f"{self.name}:") else f"{self.name}:{written}"
        return (Candidate(f"{head}@2x4", (6,)), Candidate(head, (4,)))

    def shape(self, value: HeadArg, target: ModelShape, name: str) -> KnownShape:
        """One of the target's decoder layers, ``fc`` (2 or 3 target widths in), its output head (the head's
        vocabulary) and the target's embedding (one row read per token)."""
        variant, vocab = describe(value.where)
        vocab = vocab or target.vocab_size
        hidden = target.hidden_size
        per_layer = (target.parameters - target.embedding_parameters - target.vocab_size * hidden) / target.layers
        fc = (3 if variant == EAGLE3 else 2) * hidden * hidden
        parameters = per_layer + fc + vocab * hidden + target.embedding_parameters
        return KnownShape(name, replace(target, layers=1, vocab_size=vocab, parameters=parameters),
                          "one layer at the target's width")

    def _served(self, where: str, server: str) -> tuple[str, str]:
        """(the head directory, absolute, or hub id; its variant), or a one-line error where ``server`` would read the
        head differently from our loader."""
        from specdraft_eval import published

        local = Path(where).expanduser()
        local = local if local.is_dir() else published.base() / where  # a shipped head, as the results name it
        path = str(local.resolve()) if local.is_dir() else where
        differences = server_differences(where, server)
        if differences:
            raise SpecdecError(f"{SERVER_NAMES[server]} would run head {path} differently ({differences}): write it "
                               f"as it reads it with `zoo export {path} --to {server} --out DIR` and map eagle:DIR")
        return path, describe(where)[0]

    def vllm_config(self, value: HeadArg, num_draft_tokens: int, written: str) -> dict:
        """``@KxD`` (EAGLE-2's dynamic tree) maps to vLLM's static ``speculative_token_tree`` of as many nodes
        (:func:`static_tree`): vLLM verifies a fixed tree."""
        path, method = self._served(value.where, "vllm")
        tree = value.tree
        config = {"method": method, "model": path, "num_speculative_tokens": num_draft_tokens}
        if tree is not None:
            config["speculative_token_tree"] = str(static_tree(tree.topk, tree.depth, num_draft_tokens))
        return config

    def sglang_args(self, value: HeadArg, num_draft_tokens: int, written: str) -> dict:
        """Chain: top-1, γ steps; ``@KxD``: top-K, D steps, γ nodes plus the root verified; its token map where ``zoo
        export --to sglang`` wrote one."""
        path, method = self._served(value.where, "sglang")
        tree = value.tree
        topk, steps = (tree.topk, tree.depth) if tree else (1, num_draft_tokens)
        args = {"speculative-algorithm": "EAGLE3" if method == EAGLE3 else "EAGLE",
                "speculative-draft-model-path": path, "speculative-num-steps": steps,
                "speculative-eagle-topk": topk, "speculative-num-draft-tokens": num_draft_tokens + 1}
        token_map = Path(path) / TOKEN_MAP
        return args | ({"speculative-token-map": str(token_map)} if token_map.is_file() else {})


KIND = EagleKind()
