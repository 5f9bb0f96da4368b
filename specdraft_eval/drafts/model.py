"""A draft that is a causal LM with its own KV cache: a separate small model or a layer view."""

from __future__ import annotations

import copy

import torch

from specdraft_eval.engine import kv_cache
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError

DRAFT_VOCAB_FILE = "draft_vocab.json"
"""In a draft directory: the token ids its reduced output head covers (``zoo prune --vocab-top K``)."""


def choose(logits: torch.Tensor, sampler: Sampler, ids: torch.Tensor | None,
           vocab_size: int) -> tuple[int, torch.Tensor | None]:
    """The drafted token id and, when sampling, its distribution over the target's ``vocab_size`` tokens;
    ``logits`` over the reduced head's token ``ids`` when given (zero probability elsewhere)."""
    if not sampler.do_sample:
        index = int(logits.argmax())
        return (int(ids[index]) if ids is not None else index), None
    probs = sampler.probs(logits[None])[0]
    index = int(sampler.sample(probs[None]))
    if ids is None:
        return index, probs
    full = torch.zeros(vocab_size, dtype=probs.dtype, device=probs.device)
    full[ids] = probs
    return int(ids[index]), full


class ModelDrafter(DrafterBase):
    """Drafts autoregressively with ``model``; keeps its cache across steps and rolls it back.

    ``vocab_size`` is the target's: logits beyond it (padding rows of a larger head) are never drafted.
    ``token_ids`` gives the draft a reduced output head over just those tokens (draft-side only: it
    proposes only them, and its distribution is zero elsewhere, which verification handles exactly).
    """

    def __init__(self, model, name: str, vocab_size: int, token_ids: list[int] | None = None) -> None:
        self.model, self.name, self.vocab_size = model, name, vocab_size
        self._ids = None
        if token_ids is not None:
            if not token_ids or min(token_ids) < 0 or max(token_ids) >= vocab_size:
                raise SpecdecError(f"draft {name!r}: its reduced head's token ids must lie in 0..{vocab_size - 1}")
            self._ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=model.device)
            full = model.get_output_embeddings()
            head = torch.nn.Linear(full.in_features, len(self._ids), bias=full.bias is not None)
            head.weight = torch.nn.Parameter(full.weight.detach()[self._ids].clone(), requires_grad=False)
            if full.bias is not None:
                head.bias = torch.nn.Parameter(full.bias.detach()[self._ids].clone(), requires_grad=False)
            model.lm_head = head.to(full.weight.device, full.weight.dtype)
        self.reset()

    @property
    def reduced_head(self) -> bool:
        """Whether the draft's output head covers only some token ids (``zoo prune --vocab-top``)."""
        return self._ids is not None

    def _logits(self, tokens: list[int]) -> torch.Tensor:
        logits = kv_cache.forward(self.model, tokens, self._cache, 1)[-1]
        return logits if self._ids is not None else logits[: self.vocab_size]

    def reset(self, capacity: int | None = None) -> None:
        self._cache = kv_cache.new_cache(self.model.config, capacity)
        self._cached: list[int] = []  # the tokens whose keys/values are in the cache

    def fork(self) -> ModelDrafter:
        """The same model, a cache of its own."""
        twin = copy.copy(self)
        twin.reset()
        return twin

    def _common_prefix(self, tokens: list[int]) -> int:
        limit = min(len(self._cached), len(tokens) - 1)  # always feed at least one token
        n = 0
        while n < limit and self._cached[n] == tokens[n]:
            n += 1
        return n

    def catch_up(self, tokens: list[int]) -> int:
        keep = self._common_prefix(tokens)
        if keep >= len(tokens) - 1:
            return 0
        kv_cache.rollback(self._cache, keep)
        kv_cache.forward(self.model, tokens[keep:-1], self._cache, 1)
        self._cached = tokens[:-1]
        return len(tokens) - 1 - keep

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        keep = self._common_prefix(tokens)
        kv_cache.rollback(self._cache, keep)
        logits = self._logits(tokens[keep:])
        drafted: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(num_tokens):
            token, probs = choose(logits, sampler, self._ids, self.vocab_size)
            drafted.append(token)
            if probs is not None:
                rows.append(probs)
            if i + 1 < num_tokens:
                logits = self._logits([token])
        self._cached = tokens + drafted[:-1]
        return Proposal(drafted, torch.stack(rows) if rows else None)
